"""The reconciler, the safety net under the broker: the database says which jobs should be with
a worker, and the reconciler (``reconcile_jobs``, every 10 s under beat) sends again whatever the
broker or a dead worker lost.
"""

from __future__ import annotations

import logging

from api.jobs.services import lifecycle as job_lifecycle
from api.jobs.services.dispatch import engine_queues_declare, job_dispatch
from api.models import JobStatus

logger = logging.getLogger(__name__)


def jobs_reconcile(*, redispatch_after_s: float) -> dict[str, int]:
    """Send again the queued jobs that no worker claimed in time (their message was lost), and hand
    back the running jobs whose worker's lease expired (the worker died) so they run again; such a
    job whose cancellation was requested ends cancelled instead (job_lifecycle.job_hand_back).
    Every job goes to its model's shared queue: one routed to a worker that died is taken by
    another. A queued job's new claim deadline is ``redispatch_after_s`` from now. Raises what the
    broker raises."""
    requeued = cancelled = 0
    for job_id in job_lifecycle.jobs_with_expired_lease():
        status = job_lifecycle.job_hand_back(job_id=job_id, worker_id=None, redispatch_after_s=0.0)
        if status == JobStatus.QUEUED:
            requeued += 1
            logger.warning("job %s: worker lease expired; back in the queue", job_id)
        elif status == JobStatus.CANCELLED:
            cancelled += 1
            logger.warning("job %s: worker lease expired with its cancellation requested; cancelled", job_id)
    stale = job_lifecycle.jobs_needing_dispatch(queued_grace_s=redispatch_after_s)
    if stale:
        engine_queues_declare()
    dispatched = 0
    for job_id in stale:
        if job_lifecycle.job_mark_dispatched(job_id=job_id, redispatch_after_s=redispatch_after_s):
            job_dispatch(job_id=job_id)
            dispatched += 1
    if requeued or dispatched or cancelled:
        logger.info("reconciler: %s jobs requeued, %s cancelled, %s dispatched", requeued, cancelled, dispatched)
    return {"requeued": requeued, "cancelled": cancelled, "dispatched": dispatched}
