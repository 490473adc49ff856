"""The Celery consumer of the ``engine`` queue, as an engine worker runs it: in the worker's own
process (``WORKER_INTAKE_PROCESS=0``) or in its intake process (api/streaming/intake_process.py).

Only the ``engine`` queue, with a non-forking pool (mlx does not survive a fork). ``run_job`` only
hands the id over, so a larger prefetch admits a burst of jobs without a broker round trip per
job. A message is acked when ``run_job`` returns, before the worker's admission claims the job: a
job whose worker dies in between is still queued, and the reconciler resends it.
"""

from __future__ import annotations


def consume(*, worker_id: str, prefetch: int, pool: str, concurrency: int, loglevel: str) -> None:
    """Run a Celery worker in this process on the engine queue until it is told to stop (SIGTERM
    or SIGINT: Celery's warm shutdown)."""
    from api.tasks import ENGINE_QUEUE
    from inference_service.celery import app

    celery_worker = app.Worker(
        hostname=f"engine@{worker_id}",
        prefetch_multiplier=prefetch,
        queues=[ENGINE_QUEUE],
        pool_cls=pool,
        concurrency=concurrency if pool == "threads" else 1,
        loglevel=loglevel,
        without_gossip=True,
        without_mingle=True,
        without_heartbeat=True,
    )
    celery_worker.start()
