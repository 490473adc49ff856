"""The Celery consumer of an engine worker's queues, run on its main thread.

A worker of model M consumes M's shared queue, its own queue (jobs routed to it by prefix
affinity) and ``engine``, the service's one queue before it served several models, so messages
sent there before an upgrade still run (api/serving/catalog.py). With the solo pool: mlx does not
survive a fork, and ``run_job`` is short (one claim of every queued job the engine has room for,
and one hand-over to the engine), so one thread consumes for the whole continuous batch. A message
is acknowledged when ``run_job`` returns, after the claim: a job whose worker dies before that is still queued, and the reconciler sends it
again, to the shared queue.

The consumer keeps its database connection from one ``run_job`` to the next: Celery's Django
fixup otherwise closes it before and after every task, and a claim that opens a PostgreSQL
connection costs the worker and the server more than the claim itself. A claim that meets a dead
connection closes it (``EngineWorkerService.admit``) and the next one opens another.
"""

from __future__ import annotations

DB_REUSE_MAX_TASKS = 1000


def consume(*, worker_id: str, model: str, prefetch: int, loglevel: str) -> None:
    """Run a Celery worker in this thread on ``model``'s queues until it is told to stop (SIGTERM
    or SIGINT: Celery's warm shutdown, which gives prefetched messages back to the broker)."""
    from api.serving.catalog import LEGACY_QUEUE, model_queue, worker_queue
    from inference_service.celery import app

    # Celery's Django fixup reads this when the worker starts: it closes the connections every
    # 2 x N tasks instead of around each one.
    app.conf.update(CELERY_DB_REUSE_MAX=DB_REUSE_MAX_TASKS)
    celery_worker = app.Worker(
        hostname=f"engine@{worker_id}",
        prefetch_multiplier=prefetch,
        queues=[worker_queue(model, worker_id), model_queue(model), LEGACY_QUEUE],
        pool_cls="solo",
        concurrency=1,
        loglevel=loglevel,
        without_gossip=True,
        without_mingle=True,
        without_heartbeat=True,
    )
    celery_worker.start()
