"""The operator's requeue: a failed, expired or cancelled job runs again from scratch."""

from __future__ import annotations

import uuid
from functools import partial

from django.db import transaction
from django.utils import timezone

from api.common.errors import JobNotFound, JobNotRequeueable
from api.jobs.services.deletion import drop_stream
from api.jobs.services.dispatch import job_dispatch_counted
from api.models import Job, JobStatus

REQUEUEABLE_STATUSES = (JobStatus.FAILED, JobStatus.EXPIRED, JobStatus.CANCELLED)


def job_requeue(*, job_id: uuid.UUID | str) -> Job:
    """Operator action: put a failed, expired or cancelled job back in the queue from scratch
    (output, counts and timings reset) and dispatch it. A job its owner deleted has no prompt
    left and is never requeued. Running jobs are never requeued here: the
    reconciler does that when their worker's lease expires."""
    now = timezone.now()
    # The prompt's ids never change (a deleted job's are gone, and it is not requeued).
    prompt = Job.objects.filter(id=job_id).values_list("prompt_token_ids", flat=True).first()
    updated = Job.objects.filter(id=job_id, status__in=REQUEUEABLE_STATUSES, deleted_at__isnull=True).update(
        status=JobStatus.QUEUED,
        output_text="",
        logprobs=None,
        finish_reason=None,
        error=None,
        prompt_tokens=len(prompt or []),
        cached_tokens=0,
        completion_tokens=0,
        worker_id=None,
        routed_worker=None,
        lease_expires_at=None,
        cancel_requested=False,
        last_seq=0,
        queued_at=now,
        started_at=None,
        first_token_at=None,
        finished_at=None,
    )
    job = Job.objects.filter(id=job_id).first()
    if job is None:
        raise JobNotFound(job_id)
    if not updated:
        raise JobNotRequeueable(status="deleted" if job.deleted_at is not None else job.status)
    transaction.on_commit(partial(_restart, str(job.id)))
    return job


def _restart(job_id: str) -> None:
    # The old run's chunks would replay as this run's: drop them before the new run starts.
    drop_stream(job_id)
    job_dispatch_counted(job_id=job_id)
