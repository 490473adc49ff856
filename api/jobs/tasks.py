"""The jobs' Celery tasks.

``run_job`` runs on engine workers (their model's queues, the solo pool: api/worker/consumer.py):
it claims the job, with every other queued job of the model the worker's engine has room for, and
starts them in the engine (api/worker/service.py). A duplicate delivery, or the message of a job an
earlier batch claim took, finds the job already claimed and starts nothing of it; a job whose message was lost is still
queued in the database, and the reconciler sends it again, to its model's shared queue.
``reconcile_jobs``, ``expire_jobs`` and ``purge_jobs`` run on the light worker under beat, as does
``drop_job_stream`` when a delete schedules it.

Every task of the app is named ``api.tasks.<name>``, whichever domain's tasks.py defines it: the
name is what a message carries, so it stays when code moves, and workers of any version take
each other's messages.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from api.jobs.services import deletion as job_deletion
from api.jobs.services import lifecycle as job_lifecycle
from api.jobs.services import reconciler
from api.webhooks import services as webhooks
from api.worker import service as worker

logger = logging.getLogger(__name__)


@shared_task(name="api.tasks.run_job", acks_late=True, ignore_result=True)
def run_job(job_id: str) -> bool:
    """Claim ``job_id`` (and the queued jobs the engine has room for) and start them in this
    worker's engine. False when ``job_id`` is not this worker's to run (see
    ``EngineWorkerService.admit``)."""
    service = worker.current()
    if service is None:
        # Not an engine worker (misrouted): leave the job queued; the reconciler re-dispatches it.
        logger.warning("run_job(%s) reached a process without an engine; ignored", job_id)
        return False
    return service.admit(str(job_id))


@shared_task(name="api.tasks.reconcile_jobs", ignore_result=True)
def reconcile_jobs() -> dict[str, int]:
    """Send again the queued jobs nobody claimed in time, and hand back the running jobs whose
    worker's lease expired (api/jobs/services/reconciler.py)."""
    return reconciler.jobs_reconcile(redispatch_after_s=float(settings.JOB_REDISPATCH_AFTER_S))


@shared_task(name="api.tasks.expire_jobs", ignore_result=True)
def expire_jobs() -> int:
    """Expire jobs that waited in the queue longer than JOB_QUEUE_TIMEOUT_S."""
    expired = job_lifecycle.jobs_expire_queued(older_than_s=float(settings.JOB_QUEUE_TIMEOUT_S))
    if expired:
        logger.info("expired %s queued jobs", expired)
    return expired


@shared_task(name="api.tasks.purge_jobs", ignore_result=True)
def purge_jobs() -> int:
    """Delete finished jobs older than JOB_RETENTION_DAYS (kept forever when it is 0), and the
    webhook deliveries that ended as long ago."""
    days = int(settings.JOB_RETENTION_DAYS)
    if days == 0:
        return 0
    webhooks.webhook_deliveries_purge(older_than_days=days)
    purged = job_deletion.jobs_purge_finished(older_than_days=days)
    if purged:
        logger.info("deleted %s jobs that finished more than %s days ago", purged, days)
    return purged


@shared_task(name="api.tasks.drop_job_stream", ignore_result=True)
def drop_job_stream(job_id: str) -> None:
    """Delete a deleted job's Redis stream again, after the output batch that may have been on its
    way when the job was deleted (api/jobs/services/deletion.py)."""
    job_deletion.drop_stream(job_id)
