"""The keys' Celery task: ``rollup_usage`` (beat, light worker) keeps the per-key daily usage table
current. Its name stays ``api.tasks.rollup_usage`` (api/jobs/tasks.py says why)."""

from __future__ import annotations

import datetime as dt

from celery import shared_task
from django.utils import timezone

from api.keys import quotas


@shared_task(name="api.tasks.rollup_usage", ignore_result=True)
def rollup_usage() -> int:
    """Refresh today's per-key UsageRecord rows from the engine's token counts on the jobs; in the
    first hour of a UTC day also yesterday's, so jobs that finished after midnight are counted."""
    now = timezone.now()
    rows = quotas.usage_rollup(day=now.date())
    if now.hour == 0:
        rows += quotas.usage_rollup(day=now.date() - dt.timedelta(days=1))
    return rows
