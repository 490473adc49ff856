"""The Celery app: Redis broker, the ``engine`` queue for jobs, the ``webhooks`` queue for webhook
attempts, beat for reconciliation.

Queues and their workers (scripts/run.sh): ``engine`` (the engine workers), ``celery`` (the light
worker, one task at a time: the reconciler, batch bookkeeping, beat's sweeps) and ``webhooks`` (the
webhooks worker, WEBHOOK_WORKERS attempts at once on Celery's thread pool). An attempt waits on a
receiver for up to WEBHOOK_TIMEOUT_S; on the light worker, ten hanging receivers held every batch
for 100 s."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inference_service.settings")

app = Celery("inference_service")
app.config_from_object("django.conf:settings", namespace="CELERY")
WEBHOOKS_QUEUE = "webhooks"
app.conf.task_routes = {"api.tasks.run_job": {"queue": "engine"},
                        "api.tasks.deliver_webhook": {"queue": WEBHOOKS_QUEUE}}
app.conf.beat_schedule = {
    # Re-dispatches queued jobs nobody holds and running jobs whose lease expired.
    "reconcile-jobs": {"task": "api.tasks.reconcile_jobs", "schedule": 10.0},
    "expire-jobs": {"task": "api.tasks.expire_jobs", "schedule": 60.0},
    # Starts, feeds, expires and ends batches whose messages were lost (api/batches/services.py).
    "tick-batches": {"task": "api.tasks.tick_batches", "schedule": 5.0},
    # Keeps the admin's per-key, per-day usage table current (it is recomputed, so idempotent).
    "rollup-usage": {"task": "api.tasks.rollup_usage", "schedule": 300.0},
    # Deletes finished jobs older than JOB_RETENTION_DAYS (does nothing when it is 0).
    "purge-jobs": {"task": "api.tasks.purge_jobs", "schedule": 3600.0},
    # Webhook retries that came due, and deliveries whose message was lost (api/webhooks/services.py).
    "send-due-webhooks": {"task": "api.tasks.send_due_webhooks", "schedule": 2.0},
}
# Each domain of the app keeps its tasks in its own tasks.py; the tasks' names (``api.tasks.<name>``,
# what the routes above and every message name) stay those of the module they came from.
app.autodiscover_tasks(["api.jobs", "api.keys", "api.webhooks", "api.batches"])


@worker_init.connect
def _keep_database_connections(**_: object) -> None:
    """A worker is a long-running process, not a request handler: it keeps its database
    connections. (Celery's Django fixup closes them after every task when CONN_MAX_AGE is 0, the
    web tier's default, and the light worker's batch tasks, one per batch job that ends, then
    spent more time connecting than working.)"""
    from django.conf import settings
    from django.db import connections

    for alias in settings.DATABASES:
        settings.DATABASES[alias]["CONN_MAX_AGE"] = None
        connections[alias].settings_dict["CONN_MAX_AGE"] = None
