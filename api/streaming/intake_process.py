"""The engine worker's intake process: ``python -m api.streaming.intake_process --worker-id ID``.

It runs the worker's Celery consumer of the ``engine`` queue (api/streaming/consumer.py, a
non-forking pool) and writes each job id that ``run_job``/``run_jobs`` hand over as one line to
the worker (api/streaming/intake.py), which admits it as before. So the consumer's work per
message (the broker round trips, Celery's request and tracing, about 1.7 ms a message on the GPU
host) no longer takes the GIL from the engine thread while a burst of jobs is being prefilled.

* The id pipe is this process's original stdout; stdout itself then goes to stderr, so nothing
  Celery prints can reach the pipe.
* Its stdin is the worker's lifeline: at end of file (the worker closes it to stop us, or has
  died, even of ``kill -9``) it stops the consumer as SIGTERM does (Celery's warm shutdown: the
  message in hand is finished, prefetched ones go back to the broker).
* If the worker cannot take an id any more (its end of the pipe is gone), the job is sent back
  to the queue, and this process stops. A job whose id is lost anyway is still ``queued`` in the
  database: the reconciler sends it again.
* With ``--listen`` (PostgreSQL), it also listens for the database's notice that jobs were queued
  (queue_listener.py) and writes a ``*`` line for each: the worker then claims the queue's head
  without waiting for the jobs' messages.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import BinaryIO

logger = logging.getLogger(__name__)


class Forwarder:
    """What ``run_job`` finds as this process's ``worker.current()``: it passes ids to the worker."""

    def __init__(self, pipe: BinaryIO) -> None:
        self._pipe = pipe
        self._lock = threading.Lock()  # the threads pool may hand ids over from several threads

    def admit(self, job_id: str) -> bool:
        if self._write(job_id):
            return True
        logger.warning("the engine worker is gone; sending job %s back to the queue", job_id)
        _send_back(job_id)
        _stop_consuming()
        return False

    def wake(self) -> bool:
        """Jobs were queued (the database's notice): the worker claims the queue's head."""
        if self._write(WAKE_LINE):
            return True
        _stop_consuming()
        return False

    def _write(self, line: str) -> bool:
        try:
            with self._lock:
                self._pipe.write(f"{line}\n".encode())
                self._pipe.flush()
            return True
        except OSError:
            return False


WAKE_LINE = "*"  # never a job id (those are UUIDs)


def _send_back(job_id: str) -> None:
    from api.tasks import dispatch_job

    try:
        dispatch_job(job_id)
    except Exception:  # the row is still queued: the reconciler sends it
        logger.warning("could not send job %s back; the reconciler will", job_id, exc_info=True)


def _stop_consuming() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def _stop_at_end_of(stream: BinaryIO) -> None:
    while stream.read(4096):
        pass
    logger.info("intake process: the engine worker closed the pipe; stopping")
    _stop_consuming()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--prefetch", type=int, default=16)
    parser.add_argument("--pool", choices=["solo", "threads"], default="solo")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--loglevel", default="INFO")
    parser.add_argument("--listen", action="store_true", help="also pass on the database's notices of queued jobs")
    args = parser.parse_args(argv)
    pipe = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inference_service.settings")
    import django

    django.setup()
    from api.streaming import worker
    from api.streaming.consumer import consume

    forwarder = Forwarder(pipe)
    worker.install(forwarder)
    threading.Thread(target=_stop_at_end_of, args=(sys.stdin.buffer,), name="intake-lifeline", daemon=True).start()
    if args.listen:
        from api.streaming.queue_listener import QueueListener, django_connect

        QueueListener(django_connect, forwarder.wake).start()
    consume(worker_id=args.worker_id, prefetch=args.prefetch, pool=args.pool, concurrency=args.concurrency,
            loglevel=args.loglevel)
    return 0


def argv(worker_id: str, *, prefetch: int, pool: str, concurrency: int, loglevel: str,
         listen: bool = False) -> list[str]:
    """The command line that starts this process with the current interpreter."""
    return [sys.executable, "-m", "api.streaming.intake_process", "--worker-id", worker_id, "--prefetch",
            str(prefetch), "--pool", pool, "--concurrency", str(concurrency), "--loglevel", loglevel,
            *(["--listen"] if listen else [])]


if __name__ == "__main__":
    sys.exit(main())
