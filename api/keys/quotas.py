"""Per-key quotas: the request rate (Redis), the submission gate on concurrent jobs and tokens per
day (the database), and the daily usage roll-up.

A key's usage is counted from its jobs, as the engine reported them. A job queued or running is
one concurrent job and reserves prompt + max_tokens of the day's tokens; a finished one charges
its prompt and completion tokens. Tokens count on the UTC day the job was created. A deleted job
keeps its counts (api/jobs/services/deletion.py), so a delete never gives tokens back. A batch's jobs
(api/batches/feed.py) are not concurrent jobs of their key, and reserve tokens only once
the feeder has sent them to the engine (``dispatch_count`` > 0); the feeder holds them back while
the key's daily tokens would not cover them.

The gate (:func:`quota_admission`) counts a key's usage with a lock on the key's row, and only
then reads the usage, so it counts every job that the key's earlier submissions admitted: two
submissions never both take the last slot. On PostgreSQL the lock, the count and the admitted job's
hold (a QuotaHold row, which counts as the job) are one statement of their own transaction: the
lock is held for the server's time to count, not for the rest of a request. The job's INSERT
deletes its hold in the same transaction, so every count sees the hold or the job. On SQLite, which
has no row locks, the write lock that every transaction takes at its start
(``transaction_mode=IMMEDIATE``, settings.py) serializes the submissions instead, and the gate
runs after the job's INSERT in its transaction.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis
from django.db import DatabaseError, connection, transaction
from django.db.models import Count, Q, Sum

from api.common import redis_keys
from api.common.errors import QuotaExceeded, rate_limit_headers
from api.common.redis_client import get_redis
from api.models import ACTIVE_STATUSES, ApiKey, Job, JobStatus, QuotaHold, UsageRecord

logger = logging.getLogger(__name__)

RATE_WINDOW_S = 60
# A hold lives the milliseconds between the gate and its job's INSERT; one older than this is
# taken for a submission that died there (its place is given back).
QUOTA_HOLD_S = 30.0


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


@contextmanager
def quota_admission(*, api_key_id: int, job_id: uuid.UUID, prompt_tokens: int, max_tokens: int,
                    now: dt.datetime) -> Iterator[None]:
    """Admit one new job of the key against its concurrency and daily token quotas, or raise
    QuotaExceeded (ApiKey.DoesNotExist if the key is gone). The caller inserts the job inside the
    block, which is the job's transaction; an exception there gives the job's place back.

    On PostgreSQL the job's place is a hold, taken before the block in a statement of its own (see
    the module docstring): the key's row is locked only while the server counts, so a submission
    that is slow to insert its job does not hold up the key's others. The job's transaction then
    turns the hold into the job. On SQLite the job is inserted first and :func:`quota_gate` counts
    it in, within the job's transaction."""
    needed = prompt_tokens + max_tokens
    if connection.vendor != "postgresql":
        with transaction.atomic():
            yield
            quota_gate(api_key_id=api_key_id, prompt_tokens=prompt_tokens, max_tokens=max_tokens, now=now)
        return
    _hold(api_key_id=api_key_id, job_id=job_id, needed=needed, now=now)
    try:
        with transaction.atomic():
            if not _hold_take(job_id):
                # Held longer than QUOTA_HOLD_S, and swept: hold again, under the key's lock until
                # the job commits (the gate's way before holds, for this rare submission only).
                _hold(api_key_id=api_key_id, job_id=job_id, needed=needed, now=now)
                _hold_take(job_id)
            yield
    except BaseException:
        try:
            QuotaHold.objects.filter(job_id=job_id).delete()
        except DatabaseError:
            logger.warning("Could not release the quota hold of job %s; it expires by itself", job_id,
                           exc_info=True)
        raise


def _hold(*, api_key_id: int, job_id: uuid.UUID, needed: int, now: dt.datetime) -> None:
    """Take the job's hold (api_quota_hold, migration 0015), or raise as quota_admission does."""
    start = connection.ops.adapt_datetimefield_value(_day_start(now))
    with connection.cursor() as cursor:
        cursor.execute("SELECT max_jobs, max_tokens, active, tokens, held FROM api_quota_hold(%s, %s, %s, %s, %s, %s, %s)",
                       [api_key_id, job_id, needed, _usage_sql(day_start="$1", key="$2"), start, QUOTA_HOLD_S,
                        not connection.in_atomic_block])
        max_jobs, max_tokens_per_day, active, tokens, held = cursor.fetchone()
    if max_jobs is None:
        raise ApiKey.DoesNotExist()
    if not held:
        _refuse(max_jobs=max_jobs, max_tokens_per_day=max_tokens_per_day, active=active, tokens=tokens,
                needed=needed, now=now)


def _hold_take(job_id: uuid.UUID) -> bool:
    """Delete the job's hold in the job's transaction; False if it expired and was swept."""
    return QuotaHold.objects.filter(job_id=job_id).delete()[0] == 1


def quota_gate(*, api_key_id: int, prompt_tokens: int, max_tokens: int, now: dt.datetime) -> None:
    """The gate on SQLite, after the job's INSERT in the caller's transaction: lock the key's row
    until that transaction ends (on SQLite, every write transaction takes the database's write lock
    at its start), and raise QuotaExceeded if the key's usage, with the job just inserted, breaks a
    quota. The limits are read from the locked row (an operator may have just changed them).
    Raises ApiKey.DoesNotExist if the key is gone."""
    max_jobs, max_tokens_per_day = (ApiKey.objects.select_for_update(no_key=True).filter(id=api_key_id)
                                    .values_list("max_concurrent_jobs", "tokens_per_day").get())
    active, tokens = _usage(api_key_id=api_key_id, now=now)
    needed = prompt_tokens + max_tokens
    if active > max_jobs or tokens > max_tokens_per_day:
        _refuse(max_jobs=max_jobs, max_tokens_per_day=max_tokens_per_day, active=active - 1, tokens=tokens - needed,
                needed=needed, now=now)


def _refuse(*, max_jobs: int, max_tokens_per_day: int, active: int, tokens: int, needed: int,
            now: dt.datetime) -> None:
    """Raise QuotaExceeded for a job needing ``needed`` tokens that does not fit beside the key's
    ``active`` jobs and ``tokens`` used today."""
    if active + 1 > max_jobs:
        raise QuotaExceeded(
            f"Too many concurrent jobs: this API key may have {max_jobs} queued or running jobs at once.",
            code="concurrent_jobs_exceeded", limit=max_jobs, remaining=0, reset_s=1.0)
    raise QuotaExceeded(
        f"Daily token quota reached: {tokens} of {max_tokens_per_day} tokens used today and this "
        f"job may need {needed}.",
        code="tokens_per_day_exceeded", limit=max_tokens_per_day,
        remaining=max(0, max_tokens_per_day - tokens), reset_s=quota_day_reset_s(now))


def quota_day_reset_s(now: dt.datetime) -> float:
    """Seconds until the daily token quota starts again (UTC midnight)."""
    return (_day_start(now) + dt.timedelta(days=1) - now).total_seconds()


def _day_start(now: dt.datetime) -> dt.datetime:
    return now.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)


# (jobs queued or running, tokens charged since UTC midnight) of one key: the usage rule of the
# module docstring, its jobs and its holds. SQL rather than the ORM because the gate runs it while
# it holds the key's lock, and compiling the equivalent aggregate took several times as long as
# running it. ``{day_start}`` and ``{key}`` are the placeholders of the caller's driver.
_USAGE_SQL = """
SELECT a.active + h.active, a.tokens + f.tokens + h.tokens
FROM (SELECT
  COUNT(CASE WHEN batch_id IS NULL THEN 1 END) AS active,
  COALESCE(SUM(CASE
    WHEN created_at < {day_start} THEN 0
    WHEN status = '{queued}' AND batch_id IS NOT NULL AND dispatch_count = 0 THEN 0
    ELSE {prompt_length} + {max_tokens} END), 0) AS tokens
  FROM {table} WHERE api_key_id = {key} AND status IN ({active})) a,
 (SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0) AS tokens
  FROM {table} WHERE api_key_id = {key} AND created_at >= {day_start} AND status NOT IN ({active})) f,
 (SELECT COUNT(*) AS active, COALESCE(SUM(tokens), 0) AS tokens FROM {holds} WHERE api_key_id = {key}) h
"""
# The job's prompt length and max_tokens, which it keeps in JSON columns, in each backend's words.
_JSON_SQL = {
    "postgresql": ("jsonb_array_length(prompt_token_ids)", "CAST(params->>'max_tokens' AS integer)"),
    "sqlite": ("json_array_length(prompt_token_ids)", "CAST(json_extract(params, '$.max_tokens') AS integer)"),
}


def _usage_sql(*, day_start: str, key: str) -> str:
    prompt_length, max_tokens = _JSON_SQL[connection.vendor]
    return _USAGE_SQL.format(active=", ".join(f"'{status.value}'" for status in ACTIVE_STATUSES),
                             queued=JobStatus.QUEUED.value, prompt_length=prompt_length, max_tokens=max_tokens,
                             table=connection.ops.quote_name(Job._meta.db_table),
                             holds=connection.ops.quote_name(QuotaHold._meta.db_table),
                             day_start=day_start, key=key)


def _usage(*, api_key_id: int, now: dt.datetime) -> tuple[int, int]:
    with connection.cursor() as cursor:
        cursor.execute(*usage_statement(api_key_id=api_key_id, now=now))
        active, tokens = cursor.fetchone()
    return int(active), int(tokens)


def usage_statement(*, api_key_id: int, now: dt.datetime) -> tuple[str, list[Any]]:
    """The gate's count of the key's usage as this connection's driver takes it: SQL and parameters."""
    start = connection.ops.adapt_datetimefield_value(_day_start(now))  # SQLite compares them as text
    # In order of appearance: day_start, key, key, day_start, key.
    return _usage_sql(day_start="%s", key="%s"), [start, api_key_id, api_key_id, start, api_key_id]


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
