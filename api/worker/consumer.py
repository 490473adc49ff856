"""The Celery consumer of the ``engine`` queue, run on an engine worker's main thread.

Only the ``engine`` queue, with the solo pool: mlx does not survive a fork, and ``run_job`` is
short (a claim and a hand-over to the engine), so one thread consumes for the whole continuous
batch. A message is acknowledged when ``run_job`` returns, after the claim: a job whose worker
dies before that is still queued, and the reconciler sends it again.
"""

from __future__ import annotations


def consume(*, worker_id: str, prefetch: int, loglevel: str) -> None:
    """Run a Celery worker in this thread on the engine queue until it is told to stop (SIGTERM
    or SIGINT: Celery's warm shutdown, which gives prefetched messages back to the broker)."""
    from api.tasks import ENGINE_QUEUE
    from inference_service.celery import app

    celery_worker = app.Worker(
        hostname=f"engine@{worker_id}",
        prefetch_multiplier=prefetch,
        queues=[ENGINE_QUEUE],
        pool_cls="solo",
        concurrency=1,
        loglevel=loglevel,
        without_gossip=True,
        without_mingle=True,
        without_heartbeat=True,
    )
    celery_worker.start()
