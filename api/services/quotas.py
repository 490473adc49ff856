"""Per-key quotas: request rate (Redis), tokens per day and concurrent jobs (DB), and the daily
usage roll-up. Token usage comes from the engine's own counts recorded on each Job."""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import Any

import redis
from django.db import connection
from django.db.models import Count, Q, Sum
from django.utils import timezone

from api import keys
from api.errors import QuotaExceeded
from api.models import ACTIVE_STATUSES, ApiKey, Job, KeyDayTokens, UsageRecord
from api.redis_client import get_redis

logger = logging.getLogger(__name__)

RATE_WINDOW_S = 60


@dataclass(frozen=True)
class RateLimitState:
    limit: int
    remaining: int
    reset_s: float

    def headers(self) -> dict[str, str]:
        """The same x-ratelimit-* headers a 429 carries (QuotaExceeded.headers)."""
        return {
            "x-ratelimit-limit": str(self.limit),
            "x-ratelimit-remaining": str(max(0, self.remaining)),
            "x-ratelimit-reset": f"{self.reset_s:.0f}s",
        }


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
        pipe.incr(keys.rate_limit_key(api_key.id, window))
        pipe.expire(keys.rate_limit_key(api_key.id, window), RATE_WINDOW_S + 5)
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
        count = int(get_redis().get(keys.rate_limit_key(api_key.id, window)) or 0)
    except redis.RedisError:
        return None
    limit = api_key.requests_per_minute
    return RateLimitState(limit=limit, remaining=limit - count, reset_s=(window + 1) * RATE_WINDOW_S - now)


def _day_bounds(now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    start = now.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return start, start + dt.timedelta(days=1)


# (jobs queued or running, tokens charged since UTC midnight) of one key. Raw SQL because this
# runs inside every submission's locked section, and compiling the equivalent ORM aggregate cost
# ~3 ms of CPU per POST (more than the query itself). Tokens are the engine's counts for finished
# jobs plus a reservation of prompt + max_tokens for jobs still queued or running.
#
# PostgreSQL reads the finished jobs' tokens from KeyDayTokens (kept by a trigger, see the model)
# and sums only the key's active jobs, whatever the day's volume. SQLite sums the day's jobs.
# On PostgreSQL a submission's gate runs migration 0004's api_key_gate function, which repeats the
# PostgreSQL query: change both together (tests/api/test_submission_round_trip.py compares them).
_KEY_USAGE_SQL = {
    "postgresql": """
SELECT
  COUNT(*) AS active_jobs,
  COALESCE(SUM(CASE WHEN created_at >= %s THEN {prompt_len} + {max_tokens} ELSE 0 END), 0)
    + COALESCE((SELECT tokens FROM {day_table} WHERE api_key_id = %s AND day = %s), 0) AS tokens_used
FROM {table}
WHERE api_key_id = %s AND status IN ({active})
""",
    "sqlite": """
SELECT
  COALESCE(SUM(CASE WHEN status IN ({active}) THEN 1 ELSE 0 END), 0) AS active_jobs,
  COALESCE(SUM(CASE
    WHEN created_at < %s THEN 0
    WHEN status IN ({active}) THEN {prompt_len} + {max_tokens}
    ELSE prompt_tokens + completion_tokens END), 0) AS tokens_used
FROM {table}
WHERE api_key_id = %s AND (status IN ({active}) OR created_at >= %s)
""",
}
_JSON_SQL = {
    "postgresql": ("jsonb_array_length(prompt_token_ids)", "CAST(params->>'max_tokens' AS integer)"),
    "sqlite": ("json_array_length(prompt_token_ids)", "CAST(json_extract(params, '$.max_tokens') AS integer)"),
}


def _key_usage_sql() -> str:
    prompt_len, max_tokens = _JSON_SQL[connection.vendor]
    active = ", ".join(f"'{status.value}'" for status in ACTIVE_STATUSES)
    quote = connection.ops.quote_name
    return _KEY_USAGE_SQL[connection.vendor].format(
        active=active, prompt_len=prompt_len, max_tokens=max_tokens, table=quote(Job._meta.db_table),
        day_table=quote(KeyDayTokens._meta.db_table))


def _key_usage_params(*, api_key_id: Any, now: dt.datetime) -> list[Any]:
    start = _day_bounds(now)[0]
    if connection.vendor == "postgresql":
        return [start, api_key_id, start.date(), api_key_id]
    adapted = connection.ops.adapt_datetimefield_value(start)  # SQLite compares text
    return [adapted, api_key_id, adapted]


def _key_usage(*, api_key: ApiKey, now: dt.datetime) -> tuple[int, int]:
    """(jobs queued or running, tokens charged since UTC midnight) of a key, in one query."""
    with connection.cursor() as cursor:
        cursor.execute(_key_usage_sql(), _key_usage_params(api_key_id=api_key.id, now=now))
        active, tokens = cursor.fetchone()
    return int(active), int(tokens)


def api_key_tokens_used_today(*, api_key: ApiKey, now: dt.datetime | None = None) -> int:
    return _key_usage(api_key=api_key, now=now or timezone.now())[1]


@dataclass(frozen=True)
class KeyUsage:
    """A key's limits (from its locked row) and its usage, this submission's job included."""

    max_concurrent_jobs: int
    tokens_per_day: int
    active_jobs: int
    tokens_used: int

    def exceeded(self) -> bool:
        return self.active_jobs > self.max_concurrent_jobs or self.tokens_used > self.tokens_per_day


def quota_key_usage(*, api_key: ApiKey, now: dt.datetime) -> KeyUsage:
    """The key's concurrency and daily token limits (as loaded) and its usage now, counted as the
    gate counts it: a snapshot, no lock taken."""
    active, tokens = _key_usage(api_key=api_key, now=now)
    return KeyUsage(api_key.max_concurrent_jobs, api_key.tokens_per_day, active, tokens)


def quota_day_reset_s(now: dt.datetime) -> float:
    """Seconds until the daily token quota starts again (UTC midnight)."""
    return (_day_bounds(now)[1] - now).total_seconds()


def quota_check_job(*, api_key: ApiKey, prompt_tokens: int, max_tokens: int) -> None:
    """Lock the key's row (until the caller's transaction ends) and raise QuotaExceeded if the
    job just inserted by this transaction breaks the key's concurrency or daily token quota.

    Call it after the INSERT, in the same transaction, and let the exception roll the insert back.
    The usage is read once the lock is granted, so it counts every job committed by the key's
    earlier submissions plus this one: two submissions cannot both take the last slot. The limits
    come from the locked row (an operator may have just changed them). On PostgreSQL outside a
    transaction, ``job_insert_within_quota`` does all of this in one round trip instead."""
    now = timezone.now()
    usage = _lock_key_and_usage(api_key=api_key, now=now)
    quota_raise_if_exceeded(usage, prompt_tokens=prompt_tokens, max_tokens=max_tokens, now=now)


def quota_raise_if_exceeded(usage: KeyUsage, *, prompt_tokens: int, max_tokens: int, now: dt.datetime) -> None:
    """QuotaExceeded (429) if ``usage`` breaks the concurrency or the daily token quota."""
    if usage.active_jobs > usage.max_concurrent_jobs:
        raise QuotaExceeded(
            f"Too many concurrent jobs: this API key may have {usage.max_concurrent_jobs} queued or running jobs at once.",
            code="concurrent_jobs_exceeded",
            limit=usage.max_concurrent_jobs,
            remaining=0,
            reset_s=1.0,
        )
    if usage.tokens_used > usage.tokens_per_day:
        needed = prompt_tokens + max_tokens
        before = usage.tokens_used - needed
        _, end = _day_bounds(now)
        raise QuotaExceeded(
            f"Daily token quota reached: {before} of {usage.tokens_per_day} tokens used today and this "
            f"job may need {needed}.",
            code="tokens_per_day_exceeded",
            limit=usage.tokens_per_day,
            remaining=max(0, usage.tokens_per_day - before),
            reset_s=(end - now).total_seconds(),
        )


# NO KEY UPDATE: serializes the key's submissions without blocking the foreign-key checks
# (KEY SHARE) of jobs that reference the key.
_LOCK_KEY_SQL = "SELECT max_concurrent_jobs, tokens_per_day FROM {table} WHERE id = %s FOR NO KEY UPDATE"


def _lock_key_sql() -> str:
    return _LOCK_KEY_SQL.format(table=connection.ops.quote_name(ApiKey._meta.db_table))


def _lock_key_and_usage(*, api_key: ApiKey, now: dt.datetime) -> KeyUsage:
    """The key's limits and usage, the key row locked.

    The lock is held until the submission commits, so every round trip inside it is paid by every
    submission of the key queued behind it. On PostgreSQL the lock and the usage query travel as
    one round trip: two statements in one simple-protocol call, each with its own snapshot, so the
    usage is read after the lock was granted (a single statement would read it from before)."""
    usage_params = _key_usage_params(api_key_id=api_key.id, now=now)
    lock_sql = _lock_key_sql()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"{lock_sql}; {_key_usage_sql()}", [api_key.id, *usage_params])
            limits = cursor.fetchone()
            cursor.nextset()
            usage = cursor.fetchone()
        else:  # SQLite: no row locks; its single writer serializes the submissions
            cursor.execute(lock_sql.removesuffix(" FOR NO KEY UPDATE"), [api_key.id])
            limits = cursor.fetchone()
            cursor.execute(_key_usage_sql(), usage_params)
            usage = cursor.fetchone()
    if limits is None:
        raise ApiKey.DoesNotExist(f"API key {api_key.id} no longer exists")
    return KeyUsage(int(limits[0]), int(limits[1]), int(usage[0]), int(usage[1]))


def quota_gate_sql() -> str:
    """The statement :func:`job_insert_within_quota` runs after the INSERT (PostgreSQL): the key's
    gate, migration 0004's ``api_key_gate`` function. It locks the key's row, then reads the key's
    limits and usage once the lock is granted and deletes the job again if it breaks a quota, so
    the lock is held for no client round trip, only until the ``COMMIT`` that follows in the same
    call, and the gate's plans are the connection's, not made again under the lock. Its row gives
    the :class:`KeyUsage`, and the job was deleted exactly when ``KeyUsage.exceeded()``; no row
    means the key no longer exists. Parameters: :func:`quota_gate_params`."""
    return "SELECT * FROM api_key_gate(%s, %s, %s, %s)"


def quota_gate_params(*, api_key_id: Any, job_id: Any, now: dt.datetime) -> list[Any]:
    start = _day_bounds(now)[0]
    return [api_key_id, job_id, start, start.date()]


def usage_rollup(*, day: dt.date) -> int:
    """Recompute the UsageRecord rows of ``day`` (UTC) from the jobs created that day. Idempotent:
    running it twice, or after more jobs finished, gives the same totals as running it once."""
    start = dt.datetime.combine(day, dt.time.min, tzinfo=dt.UTC)
    rows = (
        Job.objects.filter(created_at__gte=start, created_at__lt=start + dt.timedelta(days=1), api_key__isnull=False)
        .values("api_key", "owner")
        .annotate(
            n=Count("id"),
            prompt=Sum("prompt_tokens", filter=~Q(status__in=ACTIVE_STATUSES)),
            cached=Sum("cached_tokens", filter=~Q(status__in=ACTIVE_STATUSES)),
            completion=Sum("completion_tokens", filter=~Q(status__in=ACTIVE_STATUSES)),
        )
    )
    count = 0
    for row in rows:
        UsageRecord.objects.update_or_create(
            api_key_id=row["api_key"],
            day=day,
            defaults={
                "owner_id": row["owner"],
                "requests": row["n"],
                "prompt_tokens": row["prompt"] or 0,
                "cached_tokens": row["cached"] or 0,
                "completion_tokens": row["completion"] or 0,
            },
        )
        count += 1
    return count
