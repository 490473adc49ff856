"""A job's lease and its way back to the queue: hand-backs, lease renewal, re-dispatch, expiry.
The claim is in claim.py, what a worker writes of its running jobs in outputs.py.

Every transition is one conditional UPDATE (``filter(id=..., status=...).update(...)``): a job
runs at most once at a time, and a duplicate Celery delivery, a late worker or a second
reconciler does nothing. Each function returns whether it changed the row.

Leases: an ``in_progress`` job's ``lease_expires_at`` is renewed by its worker's heartbeat; when it
passes, the reconciler hands the job back to the queue. A ``queued`` job's ``lease_expires_at`` is
the time by which a worker should have claimed it (set when it is dispatched); when it passes, the
reconciler dispatches the job again (its broker message was lost, e.g. Redis was flushed).
"""

from __future__ import annotations

import datetime as dt
import logging
from functools import partial

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from api.models import Job, JobStatus
from api.streaming.job_end import stream_job_end
from api.webhooks.job_events import job_webhooks_enqueue

logger = logging.getLogger(__name__)


def job_hand_back(*, job_id: str, worker_id: str | None, redispatch_after_s: float) -> JobStatus | None:
    """A running job leaves its worker (handed back on shutdown, or its lease expired). With
    ``worker_id``, only if that worker still holds it; without, only if its lease has expired.

    It goes back to the queue (in_progress → queued), unless its cancellation was requested: then
    it ends ``cancelled`` (with the text and usage its progress recorded) and its watchers are sent
    that end. The worker that was to stop it is gone, and the claim and the reconciler never take
    a queued job whose cancellation was requested, so it would otherwise wait, counted against its
    key's concurrent jobs, until it expired. Returns the job's new status, or None where nothing
    changed."""
    now = timezone.now()
    rows = Job.objects.filter(id=job_id, status=JobStatus.IN_PROGRESS)
    rows = rows.filter(worker_id=worker_id) if worker_id else rows.filter(lease_expires_at__lt=now)
    # Two conditional UPDATEs: a cancel that lands between them finds the job still in progress
    # and is seen by the second; one that lands after the first finds it queued and ends it there.
    # Its text so far and the first-token time go together: both stay (a cancel in the queue ends
    # it with them) until the next claim clears both.
    if rows.filter(cancel_requested=False).update(
        status=JobStatus.QUEUED, worker_id=None, routed_worker=None,
        lease_expires_at=now + dt.timedelta(seconds=redispatch_after_s),
    ):
        return JobStatus.QUEUED
    with transaction.atomic():
        if rows.filter(cancel_requested=True).update(
            status=JobStatus.CANCELLED, finish_reason="abort", finished_at=now, lease_expires_at=None,
        ):
            job_webhooks_enqueue(job_ids=[job_id], send=False)
            transaction.on_commit(partial(_stream_end, job_id))
            return JobStatus.CANCELLED
    return None


def _stream_end(job_id: str) -> None:
    job = Job.objects.filter(id=job_id).first()
    if job is not None:
        stream_job_end(job=job)


def job_mark_dispatched(*, job_id: str, redispatch_after_s: float) -> bool:
    """A queued job was (re)sent to its model's shared queue: count it and set the claim
    deadline; no worker's routed load counts it any more."""
    return bool(
        Job.objects.filter(id=job_id, status=JobStatus.QUEUED).update(
            dispatch_count=F("dispatch_count") + 1, routed_worker=None,
            lease_expires_at=timezone.now() + dt.timedelta(seconds=redispatch_after_s),
        )
    )


def job_renew_leases(*, worker_id: str, job_ids: list[str], lease_s: float) -> int:
    """Extend the leases of the jobs this worker still holds (one UPDATE for all)."""
    if not job_ids:
        return 0
    return Job.objects.filter(id__in=job_ids, worker_id=worker_id, status=JobStatus.IN_PROGRESS).update(
        lease_expires_at=timezone.now() + dt.timedelta(seconds=lease_s)
    )


def jobs_cancel_requested(*, worker_id: str, job_ids: list[str]) -> list[str]:
    """Held jobs the worker should stop: their cancellation was requested (the fallback when the
    pub/sub message is lost), or they already ended cancelled or failed (a job whose output
    could not be stored, api/worker/sink.py)."""
    if not job_ids:
        return []
    rows = Job.objects.filter(id__in=job_ids, worker_id=worker_id).filter(
        Q(cancel_requested=True) | Q(status__in=(JobStatus.CANCELLED, JobStatus.FAILED))
    )
    return [str(pk) for pk in rows.values_list("id", flat=True)]


def jobs_needing_dispatch(*, queued_grace_s: float, limit: int = 500) -> list[str]:
    """Queued jobs whose claim deadline passed (or, never dispatched by us, queued longer than
    ``queued_grace_s``)."""
    now = timezone.now()
    stale = Q(lease_expires_at__lt=now) | Q(
        lease_expires_at__isnull=True, queued_at__lt=now - dt.timedelta(seconds=queued_grace_s)
    )
    # A batch job the feeder has not sent yet waits for it (api/batches/feed.py).
    rows = (Job.objects.filter(status=JobStatus.QUEUED, cancel_requested=False).filter(stale)
            .exclude(batch__isnull=False, dispatch_count=0))
    return [str(pk) for pk in rows.order_by("priority", "queued_at").values_list("id", flat=True)[:limit]]


def jobs_with_expired_lease(*, limit: int = 500) -> list[str]:
    rows = Job.objects.filter(status=JobStatus.IN_PROGRESS, lease_expires_at__lt=timezone.now())
    return [str(pk) for pk in rows.values_list("id", flat=True)[:limit]]


def jobs_expire_queued(*, older_than_s: float, batch: int = 1000) -> int:
    """queued → expired for jobs waiting longer than ``older_than_s``, with the webhooks of those
    that named one; ``batch`` jobs a transaction. A batch's jobs wait for their batch's completion
    window instead (api/batches/services.py)."""
    cutoff = timezone.now() - dt.timedelta(seconds=older_than_s)
    total = 0
    while True:
        with transaction.atomic():
            # Locked first, so the ids are exactly those expired here: a worker's claim of one
            # waits, then finds it no longer queued.
            stale = Job.objects.select_for_update(skip_locked=True).filter(status=JobStatus.QUEUED,
                                                                           queued_at__lt=cutoff,
                                                                           batch__isnull=True)
            ids = list(stale.values_list("id", flat=True)[:batch])
            total += Job.objects.filter(id__in=ids, status=JobStatus.QUEUED).update(
                # It never ran this attempt: its prompt is not charged (a finished job's usage is the engine's).
                status=JobStatus.EXPIRED, finish_reason=None, finished_at=timezone.now(), lease_expires_at=None,
                prompt_tokens=0, cached_tokens=0,
            )
            job_webhooks_enqueue(job_ids=ids, send=False)
        if len(ids) < batch:
            return total
