"""Wake-ups from PostgreSQL when jobs are queued (``LISTEN``), for the engine worker's intake.

Migration 0003 makes the database ``NOTIFY`` on :data:`CHANNEL` whenever a job row becomes
``queued`` (inserted, or handed back), and the notice is delivered when that transaction commits.
A worker with room then claims the queue's head at once (``jobs_claim(ahead=...)``) instead of
waiting for the job's Celery message: that message comes after the web process's publish and
behind the consumer's backlog, 8-12 ms after the commit on the GPU host during a burst.

The notice only speeds things up. Celery still delivers every job (its message then finds the job
claimed and costs nothing), so a listener that is down or reconnecting loses nothing. Every
worker hears every notice; one that is full ignores it, and ``FOR UPDATE SKIP LOCKED`` keeps two
workers with room from taking the same job.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

# Also spelled out in migrations/0003_job_queued_notify.py (a migration must not import this).
CHANNEL = "engine_jobs_queued"
RETRY_S = 1.0
POLL_S = 1.0  # how often a quiet listener checks whether it should stop


class QueueListener:
    """Calls ``on_queued()`` (on a thread of its own) for every notice that jobs were queued."""

    def __init__(self, connect: Callable[[], Any], on_queued: Callable[[], bool | None]) -> None:
        """``connect()`` returns a new autocommit psycopg connection. ``on_queued`` returning
        False means nobody takes wake-ups any more: the listener stops."""
        self._connect = connect
        self._on_queued = on_queued
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="queue-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._listen()
            except Exception:  # the database went away: Celery still delivers, so just retry
                logger.warning("queue listener lost its database connection; retrying in %.0f s", RETRY_S,
                               exc_info=True)
                self._stopping.wait(RETRY_S)

    def _listen(self) -> None:
        with self._connect() as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            logger.info("listening for queued jobs on %s", CHANNEL)
            while not self._stopping.is_set():
                for _ in conn.notifies(timeout=POLL_S):
                    if self._on_queued() is False:
                        self._stopping.set()
                        return


def django_connect() -> Any:
    """A new autocommit connection with the default database's settings (PostgreSQL only)."""
    import psycopg
    from django.db import connections

    params = connections["default"].get_connection_params()
    params.pop("cursor_factory", None)  # Django's own cursor classes need Django's connection
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    return psycopg.connect(**params, autocommit=True)
