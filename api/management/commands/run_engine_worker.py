"""``python manage.py run_engine_worker``: one engine worker process (api/worker/).

The engine runs in a child process that this one spawns (engine_worker/runtime/engine_process.py:
it loads the model; mlx never runs here, so nothing here can deadlock on a fork). This process
consumes its model's Celery queues (api/worker/consumer.py) with the solo pool on its main thread,
and writes the engine's outputs from its I/O thread. It serves the model at ``MODEL_PATH`` under
``MODEL_NAME`` (default: the folder's name).

SIGTERM (or Ctrl-C): the consumer stops (Celery's warm shutdown), running jobs get
``WORKER_DRAIN_S`` seconds to finish, the rest are handed back to the queue, and the engine process
stops once its outputs are written.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from api.worker import service as worker
from api.worker.config import WorkerConfig
from api.worker.consumer import consume
from api.worker.early_engine import child_spec, take_engine
from engine_worker.runtime import EngineChild

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Run an engine worker: load the model, consume its queues, stream job outputs."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--worker-id", default=None, help="Identity in heartbeats and job rows.")
        parser.add_argument("--loglevel", default="INFO")

    def handle(self, *args: Any, **options: Any) -> None:
        _keep_database_connections()
        # manage.py spawned the engine process before Django set up (api/worker/early_engine.py).
        config, child = take_engine(options["worker_id"])
        service = _build(config, child)
        service.start()  # the engine process has loaded the model and runs
        _wait_for_migrations(float(os.environ.get("WAIT_FOR_MIGRATIONS", "0")))
        worker.install(service)
        logger.info("engine worker %s ready (model %s at %s)", config.worker_id, config.model_name, config.model_path)
        try:
            consume(worker_id=config.worker_id, model=config.model_name, prefetch=config.prefetch,
                    loglevel=options["loglevel"])
        finally:
            worker.install(None)
            handed_back = service.shutdown()
            logger.info("engine worker %s stopped; %s jobs handed back", config.worker_id, len(handed_back))


def _wait_for_migrations(timeout_s: float) -> None:
    """With ``timeout_s`` > 0, wait until the database has every migration before taking jobs:
    ``make run`` migrates while the worker loads its model (scripts/run.sh)."""
    if timeout_s <= 0:
        return
    import time

    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    deadline = time.monotonic() + timeout_s
    while True:
        executor = MigrationExecutor(connection)
        if not executor.migration_plan(executor.loader.graph.leaf_nodes()):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the database still lacks migrations after {timeout_s:.0f} s")
        time.sleep(0.2)


def _keep_database_connections() -> None:
    """A worker is a long-running process, not a request handler: keep its connections open.
    (Celery's Django fixup closes connections after every task when CONN_MAX_AGE is 0, the web
    default, which would make each job admission reconnect to the database.)"""
    from django.db import connections

    for alias in settings.DATABASES:
        settings.DATABASES[alias]["CONN_MAX_AGE"] = None
        connections[alias].settings_dict["CONN_MAX_AGE"] = None


def _build(config: WorkerConfig, child: EngineChild | None) -> worker.EngineWorkerService:
    """The service, its engine in a child process (``child``, or one spawned now: it loads the
    model, and this process never evaluates an mlx array), its outputs written by this process's
    I/O thread."""
    from api.common.redis_client import get_redis
    from api.jobs.services.dispatch import job_dispatch
    from api.worker.sink import RedisJobSink
    from engine_worker.runtime import EngineProcess

    redis_client = get_redis()
    spec = child.spec if child is not None else child_spec(config)

    def make_host(sink, on_tick, on_refused):  # noqa: ANN001, ANN202 - HostFactory
        return EngineProcess(spec, sink, on_tick=on_tick, on_refused=on_refused, child=child)

    return worker.EngineWorkerService(
        config=config, make_host=make_host, sink=RedisJobSink(worker_id=config.worker_id, redis_client=redis_client,
                                                           model=config.model_name),
        redis_client=redis_client, dispatch=lambda job_id: job_dispatch(job_id=job_id))
