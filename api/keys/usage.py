"""Reads of the calling key's quotas and usage: ``GET /api/v1/usage``.

Each quota is counted as the submission path counts it: requests in the current one-minute window
(Redis), jobs queued or running, and tokens charged since UTC midnight (finished jobs' engine
counts plus prompt + max_tokens reserved for each active job). The daily history is the usage
roll-up's rows of earlier days, newest first, after today's, which is counted from the jobs at
each read (the roll-up, every few minutes, would leave a new key's first jobs unlisted).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from api.keys.quotas import (
    KeyUsage,
    RateLimitState,
    quota_day_reset_s,
    quota_key_usage,
    quota_request_rate_state,
    usage_day_totals,
)
from api.models import ApiKey, UsageRecord


@dataclass(frozen=True)
class KeyUsageReport:
    api_key: ApiKey
    rate: RateLimitState | None  # None: Redis is unreachable, so the rate limit is not enforced either
    usage: KeyUsage
    tokens_reset_s: float
    days: list[UsageRecord]


def api_key_usage_report(*, api_key: ApiKey, days: int, now: dt.datetime) -> KeyUsageReport:
    """``api_key``'s limits and where it stands now, with its daily usage of the last ``days`` UTC
    days (today included; days without jobs have no row)."""
    today = now.astimezone(dt.UTC).date()
    earlier = UsageRecord.objects.filter(api_key=api_key, day__gte=today - dt.timedelta(days=days - 1), day__lt=today)
    return KeyUsageReport(
        api_key=api_key,
        rate=quota_request_rate_state(api_key=api_key, now=now.timestamp()),
        usage=quota_key_usage(api_key=api_key, now=now),
        tokens_reset_s=quota_day_reset_s(now),
        days=[*_today(api_key=api_key, today=today, now=now), *earlier.order_by("-day")],
    )


def _today(*, api_key: ApiKey, today: dt.date, now: dt.datetime) -> list[UsageRecord]:
    """Today's row as the roll-up would store it now (unsaved; none without jobs today)."""
    return [UsageRecord(api_key=api_key, owner_id=row["owner"], day=today, requests=row["requests"],
                        prompt_tokens=row["prompt_tokens"], cached_tokens=row["cached_tokens"],
                        completion_tokens=row["completion_tokens"], updated_at=now)
            for row in usage_day_totals(day=today, api_key_id=api_key.id)]
