"""A job's cancel, by its owner or an operator."""

from __future__ import annotations

import json
import logging
import uuid
from functools import partial

import redis
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from api.common import redis_keys
from api.common.errors import JobNotCancellable, JobNotFound
from api.common.redis_client import channel_db, get_redis
from api.models import Job, JobStatus
from api.streaming.job_end import stream_job_end
from api.webhooks.job_events import job_webhooks_enqueue

logger = logging.getLogger(__name__)


def job_cancel(*, job_id: uuid.UUID | str, owner: User | None = None) -> Job:
    """Cancel a job. A queued job becomes ``cancelled`` at once and never reaches the engine
    (workers claim only ``queued`` rows). A running job gets ``cancel_requested`` and the workers
    are told on ``engine:cancel``; the worker that holds it aborts it and records the end.
    Cancelling a cancelled job is a no-op; cancelling another finished job raises
    JobNotCancellable. ``owner`` restricts the lookup (None: any job, for operators)."""
    jobs = (Job.objects.filter(id=job_id) if owner is None
            else Job.objects.filter(id=job_id, owner=owner, deleted_at__isnull=True))
    ended_in_queue = False
    # A job can move queued -> in_progress between our two UPDATEs; loop until one of them wins
    # or the job is finished. Each pass is one conditional UPDATE, so there is no lost update.
    for _ in range(3):
        now = timezone.now()
        with transaction.atomic():
            # It never ran: nothing is charged (a finished job's usage is what the engine processed).
            ended_in_queue = bool(jobs.filter(status=JobStatus.QUEUED).update(
                status=JobStatus.CANCELLED, cancel_requested=True, finished_at=now, prompt_tokens=0, cached_tokens=0,
            ))
            if ended_in_queue:
                job_webhooks_enqueue(job_ids=[job_id])
        if ended_in_queue:
            break
        if jobs.filter(status=JobStatus.IN_PROGRESS).update(cancel_requested=True):
            transaction.on_commit(partial(_publish_cancel, str(job_id)))
            break
        job = jobs.first()
        if job is None:
            raise JobNotFound(job_id)
        if job.status == JobStatus.CANCELLED:
            break
        if job.is_finished:
            raise JobNotCancellable(status=job.status)
    job = jobs.first()
    if job is None:
        raise JobNotFound(job_id)
    if ended_in_queue:  # no worker will publish its final: tell its watchers here
        transaction.on_commit(partial(stream_job_end, job=job))
    return job


def _publish_cancel(job_id: str) -> None:
    try:
        client = get_redis()
        client.publish(redis_keys.cancel_channel(channel_db(client)), json.dumps({"job_id": job_id}))
    except redis.RedisError:
        # The worker also sees cancel_requested on the row when it next checks its jobs.
        logger.warning("Could not publish the cancel of job %s", job_id, exc_info=True)
