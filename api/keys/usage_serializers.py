"""GET /api/v1/usage: its query and its answer (see usage.py)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from api.keys.usage import KeyUsageReport

USAGE_MAX_DAYS = 90


class UsageQuerySerializer(serializers.Serializer):
    days = serializers.IntegerField(min_value=1, max_value=USAGE_MAX_DAYS, default=7,
                                    help_text="Days of daily usage to list, today included")


class UsageKeySerializer(serializers.Serializer):
    prefix = serializers.CharField()
    name = serializers.CharField()
    created_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(allow_null=True)


class RequestRateSerializer(serializers.Serializer):
    limit = serializers.IntegerField()
    used = serializers.IntegerField(allow_null=True, help_text="Requests in the current one-minute window; "
                                                               "null when the rate limit cannot be read")
    remaining = serializers.IntegerField(allow_null=True)
    reset_s = serializers.FloatField(allow_null=True, help_text="Seconds until the window ends")


class ConcurrentJobsSerializer(serializers.Serializer):
    limit = serializers.IntegerField()
    active = serializers.IntegerField(help_text="Jobs queued or running")
    remaining = serializers.IntegerField()


class DailyTokensSerializer(serializers.Serializer):
    limit = serializers.IntegerField()
    used = serializers.IntegerField(help_text="Tokens of today's finished jobs, plus prompt + max_tokens "
                                              "reserved for each job still queued or running")
    remaining = serializers.IntegerField()
    reset_s = serializers.FloatField(help_text="Seconds until UTC midnight")


class UsageDaySerializer(serializers.Serializer):
    day = serializers.DateField()
    requests = serializers.IntegerField()
    prompt_tokens = serializers.IntegerField()
    cached_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    total_tokens = serializers.IntegerField()
    updated_at = serializers.DateTimeField(help_text="When this day was counted: now for today, "
                                                "the last roll-up for earlier days")


class KeyUsageSerializer(serializers.Serializer):
    object = serializers.CharField()
    key = UsageKeySerializer()
    requests_per_minute = RequestRateSerializer()
    concurrent_jobs = ConcurrentJobsSerializer()
    tokens_per_day = DailyTokensSerializer()
    max_tokens_per_job = serializers.IntegerField()
    priority = serializers.IntegerField(help_text="The key's priority class (lower is more urgent)")
    days = UsageDaySerializer(many=True)


def usage_body(report: KeyUsageReport) -> dict[str, Any]:
    """The answer's fields, for :class:`KeyUsageSerializer`."""
    key, usage, rate = report.api_key, report.usage, report.rate
    return {
        "object": "usage",
        "key": key,
        "requests_per_minute": {
            "limit": key.requests_per_minute,
            "used": None if rate is None else rate.limit - rate.remaining,
            "remaining": None if rate is None else max(0, rate.remaining),
            "reset_s": None if rate is None else round(rate.reset_s, 3),
        },
        "concurrent_jobs": {"limit": usage.max_concurrent_jobs, "active": usage.active_jobs,
                            "remaining": max(0, usage.max_concurrent_jobs - usage.active_jobs)},
        "tokens_per_day": {"limit": usage.tokens_per_day, "used": usage.tokens_used,
                           "remaining": max(0, usage.tokens_per_day - usage.tokens_used),
                           "reset_s": round(report.tokens_reset_s, 3)},
        "max_tokens_per_job": key.max_tokens_per_job,
        "priority": key.priority,
        "days": report.days,
    }
