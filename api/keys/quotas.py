"""Per-key quotas: the request rate (Redis), the submission gate on concurrent jobs and tokens per
day (the database), and the daily usage roll-up.

A key's usage is counted from its jobs, as the engine reported them. A job queued or running is
one concurrent job and reserves prompt + max_tokens of the day's tokens; a finished one charges
its prompt and completion tokens. Tokens count on the UTC day the job was created. A deleted job
keeps its counts (api/jobs/services/deletion.py), so a delete never gives tokens back. A batch's jobs
(api/batches/feed.py) are not concurrent jobs of their key, and reserve tokens only once
the feeder has sent them to the engine (``dispatch_count`` > 0); the feeder holds them back while
the key's daily tokens would not cover them.

The gate (:func:`quota_gate`) runs inside the submission's transaction, after the job's INSERT.
It locks the key's row, so the key's submissions pass it one at a time, and only then reads the
usage, so it counts every job that the key's earlier submissions committed: two submissions never
both take the last slot. On SQLite, which has no row locks, the write lock that every transaction
takes at its start (``transaction_mode=IMMEDIATE``, settings.py) serializes them instead.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import Any

import redis
from django.db import connection
from django.db.models import Count, Q, Sum

from api.common import redis_keys
from api.common.errors import QuotaExceeded, rate_limit_headers
from api.common.redis_client import get_redis
from api.models import ACTIVE_STATUSES, ApiKey, Job, JobStatus, UsageRecord

logger = logging.getLogger(__name__)

RATE_WINDOW_S = 60


@dataclass(frozen=True)
class RateLimitState:
    limit: int
    remaining: int
    reset_s: float

    def headers(self) -> dict[str, str]:
        return rate_limit_headers(limit=self.limit, remaining=self.remaining, reset_s=self.reset_s)


def quota_consume_request(*, api_key: ApiKey, now: float | None = None) -> RateLimitState | None:
    """Count one request against the key's requests-per-minute (fixed one-minute window).

    Raises QuotaExceeded when the window is full. If Redis is unreachable the request is let
    through (returns None): the rate limit protects the service, it must not take it down."""
    now = time.time() if now is None else now
    window = int(now // RATE_WINDOW_S)
    reset_s = (window + 1) * RATE_WINDOW_S - now
    limit = api_key.requests_per_minute
    try:
        pipe = get_redis().pipeline()
        pipe.incr(redis_keys.rate_limit_key(api_key.id, window))
        pipe.expire(redis_keys.rate_limit_key(api_key.id, window), RATE_WINDOW_S + 5)
        count = int(pipe.execute()[0])
    except redis.RedisError as exc:
        logger.warning("Rate limit not enforced for key %s: Redis error %s", api_key.id, exc)
        return None
    if count > limit:
        raise QuotaExceeded(
            f"Rate limit reached: {limit} requests per minute for this API key.",
            code="requests_per_minute_exceeded",
            limit=limit,
            remaining=0,
            reset_s=reset_s,
        )
    return RateLimitState(limit=limit, remaining=limit - count, reset_s=reset_s)


def quota_request_rate_state(*, api_key: ApiKey, now: float | None = None) -> RateLimitState | None:
    """Where the key stands in the current one-minute window, without counting a request
    (None if Redis is unreachable)."""
    now = time.time() if now is None else now
    window = int(now // RATE_WINDOW_S)
    try:
        count = int(get_redis().get(redis_keys.rate_limit_key(api_key.id, window)) or 0)
    except redis.RedisError:
        return None
    limit = api_key.requests_per_minute
    return RateLimitState(limit=limit, remaining=limit - count, reset_s=(window + 1) * RATE_WINDOW_S - now)


@dataclass(frozen=True)
class KeyUsage:
    """A key's concurrency and daily token limits, and its usage against them."""

    max_concurrent_jobs: int
    tokens_per_day: int
    active_jobs: int
    tokens_used: int


def quota_key_usage(*, api_key: ApiKey, now: dt.datetime) -> KeyUsage:
    """The key's limits (as loaded) and its usage now, counted as the gate counts it: a snapshot,
    no lock taken."""
    active, tokens = _usage(api_key_id=api_key.id, now=now)
    return KeyUsage(api_key.max_concurrent_jobs, api_key.tokens_per_day, active, tokens)


def quota_gate(*, api_key_id: int, prompt_tokens: int, max_tokens: int, now: dt.datetime) -> None:
    """Lock the key's row until the caller's transaction ends, and raise QuotaExceeded if the key's
    usage, with the job this transaction just inserted, breaks its concurrency or daily token
    quota; the caller's transaction then rolls the job back. The limits are read from the locked
    row (an operator may have just changed them). Raises ApiKey.DoesNotExist if the key is gone."""
    # NO KEY UPDATE: serializes the key's submissions without blocking the foreign-key checks
    # (KEY SHARE) of the jobs that reference the key.
    max_jobs, max_tokens_per_day = (ApiKey.objects.select_for_update(no_key=True).filter(id=api_key_id)
                                    .values_list("max_concurrent_jobs", "tokens_per_day").get())
    # A statement of its own, after the lock was granted: its snapshot includes the jobs that the
    # lock's previous holders committed.
    active, tokens = _usage(api_key_id=api_key_id, now=now)
    if active > max_jobs:
        raise QuotaExceeded(
            f"Too many concurrent jobs: this API key may have {max_jobs} queued or running jobs at once.",
            code="concurrent_jobs_exceeded", limit=max_jobs, remaining=0, reset_s=1.0)
    if tokens > max_tokens_per_day:
        needed = prompt_tokens + max_tokens
        before = tokens - needed
        raise QuotaExceeded(
            f"Daily token quota reached: {before} of {max_tokens_per_day} tokens used today and this "
            f"job may need {needed}.",
            code="tokens_per_day_exceeded", limit=max_tokens_per_day,
            remaining=max(0, max_tokens_per_day - before), reset_s=quota_day_reset_s(now))


def quota_day_reset_s(now: dt.datetime) -> float:
    """Seconds until the daily token quota starts again (UTC midnight)."""
    return (_day_start(now) + dt.timedelta(days=1) - now).total_seconds()


def _day_start(now: dt.datetime) -> dt.datetime:
    return now.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)


# (jobs queued or running, tokens charged since UTC midnight) of one key: the usage rule of the
# module docstring. SQL rather than the ORM because the gate runs it while it holds the key's
# lock, and compiling the equivalent aggregate took several times as long as running it.
_USAGE_SQL = """
SELECT
  COUNT(CASE WHEN status IN ({active}) AND batch_id IS NULL THEN 1 END),
  COALESCE(SUM(CASE
    WHEN created_at < %s THEN 0
    WHEN status = '{queued}' AND batch_id IS NOT NULL AND dispatch_count = 0 THEN 0
    WHEN status IN ({active}) THEN {prompt_length} + {max_tokens}
    ELSE prompt_tokens + completion_tokens END), 0)
FROM {table}
WHERE api_key_id = %s AND (status IN ({active}) OR created_at >= %s)
"""
# The job's prompt length and max_tokens, which it keeps in JSON columns, in each backend's words.
_JSON_SQL = {
    "postgresql": ("jsonb_array_length(prompt_token_ids)", "CAST(params->>'max_tokens' AS integer)"),
    "sqlite": ("json_array_length(prompt_token_ids)", "CAST(json_extract(params, '$.max_tokens') AS integer)"),
}


def _usage(*, api_key_id: int, now: dt.datetime) -> tuple[int, int]:
    prompt_length, max_tokens = _JSON_SQL[connection.vendor]
    sql = _USAGE_SQL.format(active=", ".join(f"'{status.value}'" for status in ACTIVE_STATUSES),
                            queued=JobStatus.QUEUED.value,
                            prompt_length=prompt_length, max_tokens=max_tokens,
                            table=connection.ops.quote_name(Job._meta.db_table))
    start = connection.ops.adapt_datetimefield_value(_day_start(now))  # SQLite compares them as text
    with connection.cursor() as cursor:
        cursor.execute(sql, [start, api_key_id, start])
        active, tokens = cursor.fetchone()
    return int(active), int(tokens)


def usage_day_totals(*, day: dt.date, api_key_id: int | None = None) -> list[dict[str, Any]]:
    """Each key's usage on ``day`` (UTC), counted from the jobs created that day (all keys, or
    ``api_key_id``'s): ``api_key``, ``owner``, ``requests`` (every job) and the engine's
    ``prompt_tokens``, ``cached_tokens`` and ``completion_tokens`` of the finished ones. The one
    definition of a day's usage: the roll-up stores it, ``GET /api/v1/usage`` reads today's live."""
    start = dt.datetime.combine(day, dt.time.min, tzinfo=dt.UTC)
    jobs = Job.objects.filter(created_at__gte=start, created_at__lt=start + dt.timedelta(days=1), api_key__isnull=False)
    if api_key_id is not None:
        jobs = jobs.filter(api_key_id=api_key_id)
    finished = ~Q(status__in=ACTIVE_STATUSES)
    rows = jobs.values("api_key", "owner").annotate(
        requests=Count("id"),
        prompt=Sum("prompt_tokens", filter=finished),
        cached=Sum("cached_tokens", filter=finished),
        completion=Sum("completion_tokens", filter=finished),
    )
    return [{"api_key": row["api_key"], "owner": row["owner"], "requests": row["requests"],
             "prompt_tokens": row["prompt"] or 0, "cached_tokens": row["cached"] or 0,
             "completion_tokens": row["completion"] or 0} for row in rows]


def usage_rollup(*, day: dt.date) -> int:
    """Recompute the UsageRecord rows of ``day`` (UTC) from the jobs created that day. Idempotent:
    running it twice, or after more jobs finished, gives the same totals as running it once."""
    count = 0
    for row in usage_day_totals(day=day):
        UsageRecord.objects.update_or_create(
            api_key_id=row["api_key"],
            day=day,
            defaults={"owner_id": row["owner"], "requests": row["requests"], "prompt_tokens": row["prompt_tokens"],
                      "cached_tokens": row["cached_tokens"], "completion_tokens": row["completion_tokens"]},
        )
        count += 1
    return count
