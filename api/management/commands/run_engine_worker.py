"""``python manage.py run_engine_worker``: one engine worker process (api/worker/).

It loads the model itself (never in a process that forks later, mlx-notes.md section 6), runs
EngineCore on its engine thread, and consumes only the ``engine`` Celery queue with the solo pool
on its main thread.

SIGTERM (or Ctrl-C): the consumer stops (Celery's warm shutdown), running jobs get
``WORKER_DRAIN_S`` seconds to finish, the rest are handed back to the queue, the engine thread is
stopped, and the process exits without the interpreter's finalization (see
``_exit_without_finalization``).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import replace
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from api.worker import service as worker
from api.worker.config import WorkerConfig
from api.worker.consumer import consume

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Run an engine worker: load the model, consume the 'engine' queue, stream job outputs."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--worker-id", default=None, help="Identity in heartbeats and job rows.")
        parser.add_argument("--loglevel", default="INFO")

    def handle(self, *args: Any, **options: Any) -> None:
        _keep_database_connections()
        config = WorkerConfig.from_settings()
        if options["worker_id"]:
            config = replace(config, worker_id=options["worker_id"])
        service, engine = _build(config)
        worker.install(service)
        service.start()
        logger.info("engine worker %s ready (model %s)", config.worker_id, config.model_path)
        try:
            consume(worker_id=config.worker_id, prefetch=config.prefetch, loglevel=options["loglevel"])
        finally:
            try:
                handed_back = service.shutdown()
                logger.info("engine worker %s stopped; %s jobs handed back", config.worker_id, len(handed_back))
            finally:
                # Always stop the engine thread before the interpreter exits (mlx can abort otherwise).
                worker.install(None)
                engine.stop()
                engine.close()
        _exit_without_finalization()


def _keep_database_connections() -> None:
    """A worker is a long-running process, not a request handler: keep its connections open.
    (Celery's Django fixup closes connections after every task when CONN_MAX_AGE is 0, the web
    default, which would make each job admission reconnect to the database.)"""
    from django.db import connections

    for alias in settings.DATABASES:
        settings.DATABASES[alias]["CONN_MAX_AGE"] = None
        connections[alias].settings_dict["CONN_MAX_AGE"] = None


def _exit_without_finalization() -> None:
    """Leave the process now that everything is stopped, handed back and written, skipping the
    interpreter's finalization: native libraries (mlx, OpenBLAS) keep threads of their own, and
    tearing their static objects down while a daemon thread may still call into them can abort
    the process (``terminate called without an active exception``) after an orderly stop."""
    import os

    from django.db import connections

    connections.close_all()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _build(config: WorkerConfig) -> tuple[worker.EngineWorkerService, Any]:
    """Load the model in this process, start the engine thread, wire the service to Redis and the
    database. Returns the service and the engine."""
    from api.redis_client import get_redis
    from api.tasks import dispatch_job
    from api.worker.sink import RedisJobSink
    from engine_worker.engine_core import EngineConfig, EngineCore
    from engine_worker.loader import context_length, load_model

    redis_client = get_redis()
    model, tokenizer = load_model(config.model_path)
    engine = EngineCore(model, tokenizer, EngineConfig.from_env())
    engine.start()
    sink = RedisJobSink(worker_id=config.worker_id, redis_client=redis_client)
    service = worker.EngineWorkerService(config=config, engine=engine, sink=sink, redis_client=redis_client,
                                         dispatch=dispatch_job, context_length=context_length(model))
    return service, engine
