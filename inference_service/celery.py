"""The Celery app: Redis broker, the ``engine`` queue for jobs, beat for reconciliation."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inference_service.settings")

app = Celery("inference_service")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_routes = {"api.tasks.run_job": {"queue": "engine"}}
app.conf.beat_schedule = {
    # Re-dispatches queued jobs nobody holds and running jobs whose lease expired.
    "reconcile-jobs": {"task": "api.tasks.reconcile_jobs", "schedule": 10.0},
    "expire-jobs": {"task": "api.tasks.expire_jobs", "schedule": 60.0},
    # Starts, feeds, expires and ends batches whose messages were lost (api/services/batches.py).
    "tick-batches": {"task": "api.tasks.tick_batches", "schedule": 5.0},
    # Keeps the admin's per-key, per-day usage table current (it is recomputed, so idempotent).
    "rollup-usage": {"task": "api.tasks.rollup_usage", "schedule": 300.0},
    # Deletes finished jobs older than JOB_RETENTION_DAYS (does nothing when it is 0).
    "purge-jobs": {"task": "api.tasks.purge_jobs", "schedule": 3600.0},
}
app.autodiscover_tasks()
