"""How a job reaches an engine worker: one Celery message, ``api.tasks.run_job`` with its id, on
its model's shared queue or on one of its workers' own queues (api/serving/catalog.py;
prefix-affinity routing chooses, queue_routing.py), sent once the row that says it is queued has
committed. The message is sent by task name: the task runs in the engine workers, and nothing of
theirs is imported here. A send that fails leaves the job queued, and the reconciler sends it
again: the row is the truth, the broker only delivers.
"""

from __future__ import annotations

import logging

from django.db.models import F

from api.models import Job
from api.serving.catalog import LEGACY_QUEUE, configured_models, default_model_name, model_queue
from inference_service.celery import app as celery_app

logger = logging.getLogger(__name__)

RUN_JOB_TASK = "api.tasks.run_job"


def job_dispatch(*, job_id: str, queue: str | None = None) -> None:
    """Send ``job_id`` to the engine workers: one ``run_job`` message on ``queue``; without one, on
    the shared queue of the job's model (every send but a new job's: a worker that died or stopped
    must not be sent anything). Raises what the broker raises.

    The one way a job reaches the broker: the submission and the batch feeder (through
    :func:`job_dispatch_counted`), the operator's requeue, the reconciler and an engine worker that
    hands a job on all send through it."""
    if queue is None:
        model = Job.objects.filter(id=job_id).values_list("model", flat=True).first()
        queue = model_queue(model or default_model_name())  # a deleted row: its message claims nothing
    celery_app.send_task(RUN_JOB_TASK, args=[str(job_id)], queue=queue)


def job_dispatch_counted(*, job_id: str, queue: str | None = None, precounted: bool = False) -> bool:
    """:func:`job_dispatch`, with the send counted in the job's ``dispatch_count``: the send of a
    job whose queued row has just committed. Never raises: with the broker down the job stays
    queued and the reconciler sends it later. Returns whether the message was sent.

    The count is written before the send (and taken back if the send fails): a worker claims the
    job the moment the message lands, and an UPDATE of the row still running then would hold its
    lock, which the claim (``FOR UPDATE SKIP LOCKED``) passes by: the job would wait for the
    reconciler. ``precounted``: the row's ``dispatch_count`` already includes this send (job_create
    and the batch feeder write it with the row, which saves an UPDATE per submission)."""
    if not precounted:
        Job.objects.filter(id=job_id).update(dispatch_count=F("dispatch_count") + 1)
    try:
        job_dispatch(job_id=job_id, queue=queue)
    except Exception:  # noqa: BLE001 - any broker failure; the DB row is the truth
        logger.warning("Dispatch of job %s failed; the reconciler will retry", job_id, exc_info=True)
        Job.objects.filter(id=job_id, dispatch_count__gt=0).update(dispatch_count=F("dispatch_count") - 1)
        return False
    return True


def engine_queues_declare() -> None:
    """Re-create the bindings of the models' shared queues in the broker. With Redis, a FLUSHALL
    (or a fresh Redis) drops kombu's bindings, and kombu then routes published messages to a
    dead-letter queue until someone declares the queue again; producers only declare once per
    process. (A worker's own queue is not declared here: the reconciler never sends to one.)"""
    with celery_app.connection_for_write() as conn:
        for name in [LEGACY_QUEUE, *(model_queue(m.name) for m in configured_models())]:
            celery_app.amqp.queues[name](conn.default_channel).declare()
