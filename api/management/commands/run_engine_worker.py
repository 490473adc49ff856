"""``python manage.py run_engine_worker``: one engine worker process.

It loads the model itself (never in a process that forks later, mlx-notes.md section 6), runs
EngineCore on its engine thread, and consumes only the ``engine`` Celery queue with a
non-forking pool: in its intake process, a child that passes the handed-over job ids back through
a pipe (api/streaming/intake_process.py), or with ``WORKER_INTAKE_PROCESS=0`` in this process.
``run_job`` admits jobs and returns at once, so one Celery consumer feeds any number of jobs into
the engine's continuous batch.

SIGTERM (or Ctrl-C): the consumer stops (Celery's warm shutdown), running jobs get ``WORKER_DRAIN_S`` seconds to
finish, the rest are handed back to the queue, the engine thread is stopped, and the process exits
without the interpreter's finalization (native threads can abort it; see _exit_without_finalization).

Environment (besides the Django settings and ``ENGINE_*`` engine config):
``WORKER_ID``; ``JOB_LEASE_S`` (30) a held job's lease, renewed every ``WORKER_HEARTBEAT_S`` (2);
``WORKER_DRAIN_S`` (30); ``JOB_REDISPATCH_AFTER_S`` (30) after which the reconciler re-sends a
queued job nobody claimed; ``WORKER_STREAM_INTERVAL_MS`` (40) least time between two writes of
plain deltas; ``WORKER_PREFETCH`` (16) job messages taken at once; ``JOB_STREAM_TTL_S`` (6 h);
``WORKER_OUTPUT_PROCESS`` (1) publish outputs from a child process (api/streaming/sink_process.py),
0 to publish from this process's I/O thread; ``WORKER_INTAKE_PROCESS`` (1) consume the queue in
a child process, 0 in this one; ``WORKER_CLAIM_AHEAD`` (the engine's running batch)
held jobs up to which an admission also claims queued jobs whose message is still on its way;
``WORKER_QUEUE_NOTIFY`` (1) on PostgreSQL, claim ahead as soon as the database notices that jobs
were queued (api/streaming/queue_listener.py), 0 to wait for their messages.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Any

from django.core.management.base import BaseCommand
from django.db import connection

from api.streaming import worker
from api.streaming.config import WorkerConfig
from api.streaming.consumer import consume
from api.streaming.intake import IntakeProcess
from api.streaming.queue_listener import QueueListener, django_connect
from api.streaming.worker import keep_database_connections

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Run an engine worker: load the model, consume the 'engine' queue, stream job outputs."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--worker-id", default=None, help="Identity in heartbeats and job rows.")
        parser.add_argument("--pool", choices=["solo", "threads"], default="solo",
                            help="Celery pool; never a forking one (mlx does not survive fork).")
        parser.add_argument("--concurrency", type=int, default=1, help="Threads for --pool threads.")
        parser.add_argument("--loglevel", default="INFO")

    def handle(self, *args: Any, **options: Any) -> None:
        from dataclasses import replace

        keep_database_connections()
        config = WorkerConfig.from_env()
        if options["worker_id"]:
            config = replace(config, worker_id=options["worker_id"])
        consumer = {"worker_id": config.worker_id, "prefetch": config.prefetch, "pool": options["pool"],
                    "concurrency": options["concurrency"], "loglevel": options["loglevel"]}
        listen = _listens(config)
        intake = _start_intake(consumer, listen) if config.intake_process else None  # before the model loads
        try:
            service, engine, sink = _build(config)
        except BaseException:
            if intake is not None:
                intake.stop(10.0)
            raise
        worker.install(service)
        service.start()
        logger.info("engine worker %s ready (model %s)", config.worker_id, config.model_path)
        listener = None
        try:
            if intake is None:
                if listen:
                    listener = QueueListener(django_connect, service.wake)
                    listener.start()
                consume(**consumer)
            else:
                logging.getLogger().setLevel(options["loglevel"].upper())
                intake.serve(service.admit, service.wake)
                _wait_for_stop_signal()
        finally:
            try:
                if intake is not None:  # no new ids from here on; those in the pipe are admitted first
                    intake.stop(config.heartbeat_s + 15.0)
                if listener is not None:
                    listener.stop()
                handed_back = service.shutdown()
                logger.info("engine worker %s stopped; %s jobs handed back", config.worker_id, len(handed_back))
            finally:
                # Always stop the engine thread before the interpreter exits (mlx can abort otherwise).
                worker.install(None)
                engine.stop()
                engine.close()
                if hasattr(sink, "close"):  # the output process writes what it has, then exits
                    sink.close(config.drain_s + 10.0)
        _exit_without_finalization()


def _listens(config: WorkerConfig) -> bool:
    """Whether to claim ahead at the database's notice of queued jobs (queue_listener.py): only
    PostgreSQL sends one, and only a worker that claims ahead can use it."""
    return config.queue_notify and config.claim_ahead != 0 and connection.vendor == "postgresql"


def _start_intake(consumer: dict[str, Any], listen: bool) -> IntakeProcess:
    """The Celery consumer in a child process (api/streaming/intake_process.py)."""
    from api.streaming import intake_process, sink_process

    intake = IntakeProcess(intake_process.argv(**consumer, listen=listen), cwd=sink_process.project_root(),
                           on_failure=_intake_process_failed)
    intake.start()
    return intake


def _wait_for_stop_signal() -> None:
    """Block until SIGTERM or SIGINT (Ctrl-C), as Celery's warm shutdown would."""
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        logger.info("engine worker: %s received; stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop.wait(1.0):
        pass


def _intake_process_failed() -> None:
    """The intake process cannot be kept running: stop this worker through the SIGTERM path."""
    logger.critical("the intake process keeps dying; shutting the engine worker down")
    os.kill(os.getpid(), signal.SIGTERM)


def _exit_without_finalization() -> None:
    """Leave the process now that everything is stopped, handed back and written, skipping the
    interpreter's finalization. Native libraries (mlx, OpenBLAS) keep threads of their own, and
    tearing their static objects down while a daemon thread of Python's may still call into them
    is a race we cannot order: one clean-clone CI run saw the worker print "terminate called
    without an active exception" and die with SIGABRT after its orderly stop (not reproduced in six
    reruns). Nothing is left to do at this point: the jobs are handed back and the engine is closed."""
    from django.db import connections

    connections.close_all()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _build(config: WorkerConfig) -> tuple[worker.EngineWorkerService, Any, Any]:
    """Start the output process, load the model in this process, start the engine thread, wire
    the runtime to Redis. Returns the service, the engine and the sink."""
    from dataclasses import replace
    from pathlib import Path

    from api.redis_client import get_redis
    from api.streaming import sink_process
    from api.streaming.fanout import GroupSender
    from api.streaming.sink import RedisJobSink
    from api.tasks import dispatch_job
    from engine_worker.config import SchedulerConfig
    from engine_worker.engine_core import EngineConfig, EngineCore
    from engine_worker.loader import context_length, load_model
    from engine_worker.runtime import JobHost
    from engine_worker.runtime.pipe_sink import PipeSink

    redis_client = get_redis()
    sender = None
    if config.output_process:
        sink: Any = PipeSink(sink_process.argv(config.worker_id), cwd=sink_process.project_root(),
                             on_failure=_output_process_failed)
        sink.start()  # before any mlx array exists in this process
    else:
        sender = GroupSender()
        sink = RedisJobSink(worker_id=config.worker_id, redis_client=redis_client, sender=sender)
    model, tokenizer = load_model(config.model_path)
    engine_config = EngineConfig.from_env()
    if config.claim_ahead < 0:  # unset: as many as the engine runs at once
        config = replace(config, claim_ahead=(engine_config.scheduler_config or SchedulerConfig()).max_running)
    engine = EngineCore(model, tokenizer, engine_config)
    engine.start()
    host = JobHost(engine, sink, model_name=Path(config.model_path).name, context_length=context_length(model),
                   stream_interval_s=config.stream_interval_s)
    service = worker.EngineWorkerService(
        config=config, host=host, redis_client=redis_client, sender=sender, dispatch=dispatch_job
    )
    return service, engine, sink


def _output_process_failed() -> None:
    """The output process cannot be kept running: stop this worker through the SIGTERM path, so
    its jobs go back to the queue and its supervisor restarts it."""
    logger.critical("the output process keeps dying; shutting the engine worker down")
    os.kill(os.getpid(), signal.SIGTERM)
