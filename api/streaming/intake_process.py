"""The engine worker's intake process: ``python -m api.streaming.intake_process --worker-id ID``.

It runs the worker's Celery consumer of the ``engine`` queue (api/streaming/consumer.py, a
non-forking pool) and claims, for the worker, the jobs that ``run_job``/``run_jobs`` hand over
(claimer.py, through an admission thread as the worker's own: admission.py). It writes each
claimed job's :class:`JobSpec` to the worker as one JSON line (api/streaming/intake.py), and the
worker starts it in its engine. So neither the consumer's work per message (the broker round
trips, Celery's request and tracing, about 1.7 ms a message on the GPU host) nor the claims'
(their UPDATE and the rows it returns, about a millisecond each) take the GIL from the engine
thread while a burst of jobs is being prefilled.

* The spec pipe is this process's original stdout; stdout itself then goes to stderr, so nothing
  Celery prints can reach the pipe.
* Its stdin comes from the worker: a line ``released <id>`` when the worker no longer holds a job
  (finished, handed back, refused), ``held <id>`` for each job the worker held when this process
  was started again. So it knows the worker's free room, and never claims a job twice. At end of
  file (the worker closes it to stop us, or has died, even of ``kill -9``) it stops claiming, sends
  the ids it had not claimed yet back to the queue, and stops the consumer as SIGTERM does
  (Celery's warm shutdown: the message in hand is finished, prefetched ones go back to the broker).
* If the worker cannot take a spec any more (its end of the pipe is gone), the jobs just claimed
  go back to the queue, and this process stops. A job lost anyway is still in the database: a
  ``queued`` one is sent again by the reconciler, and a claimed one's lease, which nobody renews,
  expires and hands it back.
* With ``--listen`` (PostgreSQL), it also listens for the database's notice that jobs were queued
  (queue_listener.py) and then claims the queue's head, as far as the worker has room, without
  waiting for the jobs' messages.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:  # Django's models load only after django.setup(), in main()
    from api.streaming.claimer import ClaimedJobs

logger = logging.getLogger(__name__)

RELEASED = "released"  # stdin: the worker no longer holds this job
HELD = "held"  # stdin: the worker holds this job (sent when this process starts again)


def follow_worker(stream: BinaryIO, claimed: ClaimedJobs, on_end: Callable[[], None]) -> None:
    """Read the worker's lines (``released``/``held``) until end of file, then call ``on_end``."""
    for line in stream:
        word, _, job_id = line.decode(errors="replace").strip().partition(" ")
        if word == RELEASED:
            claimed.discard(job_id)
        elif word == HELD:
            claimed.add(job_id)
        elif word:
            logger.warning("intake process: ignoring %r from the worker", line[:80])
    on_end()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--prefetch", type=int, default=16)
    parser.add_argument("--pool", choices=["solo", "threads"], default="solo")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--loglevel", default="INFO")
    parser.add_argument("--listen", action="store_true", help="also claim at the database's notices of queued jobs")
    parser.add_argument("--claim-ahead", type=int, default=0,
                        help="held jobs up to which a claim also takes the queue's head")
    parser.add_argument("--claim-interval-ms", type=float, default=0.0, help="least time between two claims")
    args = parser.parse_args(argv)
    pipe = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inference_service.settings")
    import django

    django.setup()
    from api.streaming import worker
    from api.streaming.claimer import ClaimedJobs, Claimer
    from api.streaming.config import WorkerConfig
    from api.streaming.consumer import consume
    from api.streaming.intake_admission import IntakeAdmission, stop_consuming
    from api.streaming.worker import keep_database_connections

    keep_database_connections()
    config = WorkerConfig.from_env()
    claimed = ClaimedJobs()
    claimer = Claimer(worker_id=args.worker_id, lease_s=config.lease_s, claim_ahead=args.claim_ahead, held=claimed)
    admission = IntakeAdmission(pipe, claimer=claimer, claimed=claimed, min_interval_s=args.claim_interval_ms / 1000,
                                redispatch_after_s=config.redispatch_after_s)
    admission.start()
    worker.install(admission)

    def worker_closed_stdin() -> None:
        logger.info("intake process: the engine worker closed the pipe; stopping")
        admission.stop()
        stop_consuming()

    threading.Thread(target=follow_worker, args=(sys.stdin.buffer, claimed, worker_closed_stdin),
                     name="intake-lifeline", daemon=True).start()
    if args.listen:
        from api.streaming.queue_listener import QueueListener, django_connect

        QueueListener(django_connect, admission.wake).start()
    try:
        consume(worker_id=args.worker_id, prefetch=args.prefetch, pool=args.pool, concurrency=args.concurrency,
                loglevel=args.loglevel)
    finally:
        admission.stop()  # a SIGTERM of our own, or from outside: nothing claimed after the consumer
    return 0


def argv(worker_id: str, *, prefetch: int, pool: str, concurrency: int, loglevel: str,
         listen: bool = False, claim_ahead: int = 0, claim_interval_ms: float = 0.0) -> list[str]:
    """The command line that starts this process with the current interpreter."""
    return [sys.executable, "-m", "api.streaming.intake_process", "--worker-id", worker_id, "--prefetch",
            str(prefetch), "--pool", pool, "--concurrency", str(concurrency), "--loglevel", loglevel,
            "--claim-ahead", str(claim_ahead), "--claim-interval-ms", str(claim_interval_ms),
            *(["--listen"] if listen else [])]


if __name__ == "__main__":
    sys.exit(main())
