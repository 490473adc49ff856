"""Removing jobs' content: a user's delete of one finished job, and the operator's retention purge.

A user's delete keeps the row as a tombstone. Its prompt, messages, token ids, output, error,
stop strings, metadata, log probabilities and idempotency key are cleared and ``deleted_at`` is
set; its status, token counts and timings stay. The key's daily token quota and the usage roll-up
count those rows (services/quotas.py), so a delete never gives a quota back. Every user-facing
read (the job, the list, cancel, the WebSocket and the events stream) treats a tombstone as not
found, and the job's Redis stream, which holds the same text, goes once the delete commits. Its
webhook deliveries lose their bodies and the pending ones end unsent, in the delete's transaction;
an attempt already sending when the delete commits is waited for (at most WEBHOOK_TIMEOUT_S), so
nothing of the job leaves the service after the delete returns. A job
still queued or running cannot be deleted: it must end first, or a worker could write its output
after the content was cleared.

What a delete does not reach: the engine workers' prefix caches keep the KV state of recent
prompts, keyed by their token ids (in memory, and on disk with ``ENGINE_SSD_CACHE_DIR``), until
the cache evicts them; they are never served as text, and only to a prompt that starts the same.

Retention (``JOB_RETENTION_DAYS``, off at 0) deletes the rows of jobs that finished that many days
ago, tombstones included. It is at least 2 days, so the rows a quota or the usage roll-up still
reads (today's, and yesterday's in the first hour of a day: api/keys/tasks.py) are never among them;
the usage records of those days stay.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from functools import partial

import redis
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from api.common import redis_keys
from api.common.errors import JobNotDeletable, JobNotFound
from api.common.redis_client import get_redis
from api.models import TERMINAL_STATUSES, Job
from api.webhooks.services import job_deliveries_erase
from api.webhooks.slots import slots_wait_released
from inference_service.celery import app as celery_app

logger = logging.getLogger(__name__)

# Request fields that hold the user's own text, besides the prompt and messages.
_CONTENT_PARAMS = ("stop",)
PURGE_BATCH = 1000
STREAM_REDROP_S = 10
# Sent by name, as the web side sends every task (dispatch.py); it runs drop_stream below.
DROP_JOB_STREAM_TASK = "api.tasks.drop_job_stream"


def job_delete(*, job_id: uuid.UUID | str, owner: User | None) -> Job:
    """Clear the content of ``owner``'s finished job and mark it deleted (see the module's
    docstring); ``owner`` None: any user's, for operators (a user's request to erase their data).
    Raises JobNotFound for no such job, another user's or one already deleted, and
    JobNotDeletable for a job that is still queued or running."""
    jobs = Job.objects.filter(id=job_id, deleted_at__isnull=True)
    if owner is not None:
        jobs = jobs.filter(owner=owner)
    try:
        job = jobs.get()
    except (Job.DoesNotExist, ValueError):
        raise JobNotFound(job_id) from None
    if not job.is_finished:
        raise JobNotDeletable(status=job.status)
    now = timezone.now()
    params = {name: value for name, value in job.params.items() if name not in _CONTENT_PARAMS}
    with transaction.atomic():
        # Conditional on the job being finished still: an operator's requeue in between wins, and
        # the delete is then refused as for any running job.
        if not jobs.filter(status__in=TERMINAL_STATUSES).update(
            prompt="", messages=None, prompt_token_ids=[], output_text="", error=None, params=params, metadata={},
            logprobs=None,
            idempotency_key=None, request_fingerprint="", deleted_at=now,
        ):
            current = jobs.first()
            if current is None:
                raise JobNotFound(job_id)
            raise JobNotDeletable(status=current.status)
        deliveries = job_deliveries_erase(job_id=str(job.id))
        transaction.on_commit(partial(_drop_stream_now_and_later, str(job.id)))
        if deliveries:
            transaction.on_commit(partial(slots_wait_released, holders=deliveries))
    job.refresh_from_db()
    return job


def _drop_stream_now_and_later(job_id: str) -> None:
    drop_stream(job_id)
    # A worker writes a job's final to the database before its last chunks and final reach the
    # stream: a client that saw the job end and deleted it at once can be a few
    # milliseconds ahead of those writes, which would make the stream again. So once more, later.
    try:
        celery_app.send_task(DROP_JOB_STREAM_TASK, args=[job_id], countdown=STREAM_REDROP_S)
    except Exception:  # noqa: BLE001 - any broker failure; the stream still expires by itself
        logger.warning("Could not schedule the second drop of deleted job %s's stream", job_id, exc_info=True)


def drop_stream(job_id: str) -> None:
    """Delete a job's Redis stream, best effort: it expires on its own (JOB_STREAM_TTL_S after its
    final) if Redis cannot be reached now. For a deleted job no reader can reach it meanwhile
    (every stream read first checks the job, which is not found once deleted)."""
    try:
        get_redis().delete(redis_keys.job_stream_key(job_id))
    except redis.RedisError:
        logger.warning("Could not delete the stream of job %s", job_id, exc_info=True)


def jobs_purge_finished(*, older_than_days: int, now: dt.datetime | None = None) -> int:
    """Delete the rows of jobs that finished more than ``older_than_days`` days before ``now``
    (at least 2), in batches; returns how many."""
    if older_than_days < 2:
        raise ValueError("jobs are kept at least 2 days: the quotas and the usage roll-up read them")
    cutoff = (now or timezone.now()) - dt.timedelta(days=older_than_days)
    purged = 0
    while True:
        ids = list(
            Job.objects.filter(status__in=TERMINAL_STATUSES, finished_at__lt=cutoff)
            .order_by().values_list("id", flat=True)[:PURGE_BATCH]
        )
        if not ids:
            return purged
        purged += Job.objects.filter(id__in=ids, status__in=TERMINAL_STATUSES).delete()[0]
