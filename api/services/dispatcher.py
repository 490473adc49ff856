"""Sends new jobs to the engine queue: from one long-lived thread per web process, after the
answer (``JOB_DISPATCH_THREAD``, the default with PostgreSQL), or on the request's thread once
its row commits (the default with SQLite).

Which one gets a job to a worker sooner depends on what wakes the worker. With SQLite it is the
message: on the 2-core VM (``bench/service_bench.py``, two runs per side, before the database's
notice existed) publishing on the request's thread reached the worker sooner, insert -> claim 8-9
ms against 10-14 ms for one job and 40-55 ms against 67-72 ms at 32 jobs, because the thread's
send competed with the client's WebSocket connect in the same process. With PostgreSQL the
commit's notice wakes the workers (api/streaming/queue_listener.py) and the message is only the
delivery that cannot be lost, so it need not hold the request up. In a burst the web processes'
CPU is what the submissions queue for, and the thread sends several ids per message:
``bench/web_post_cpu.py`` (dev VM, 4 interleaved rounds of 20 bursts of 32) measured 3.32 ms of
CPU per POST on the request's thread against 2.87 ms with the thread (medians), and a burst
answered in 97-114 ms against 84-98 ms.

Nothing is lost by answering first. The row is committed as ``queued`` with
``dispatch_count=1`` before the hand-off. If the send fails, ``job_dispatch`` takes the count
back and the reconciler resends. If the process dies with ids still waiting here, those rows
stay ``queued`` and the reconciler resends them once ``JOB_REDISPATCH_AFTER_S`` has passed, as
for any lost message. An orderly exit drains what is waiting (``atexit``).

Ids that queued up while the thread was sending go out together, up to ``MAX_IDS_PER_MESSAGE``
in one ``run_jobs`` message: a burst of 32 submissions becomes a handful of messages, each of
which costs the engine worker's Celery consumer several milliseconds of the CPU its engine
thread needs. The cap keeps a burst spread over several messages, so several engine workers
still share it.

With ``settings.JOB_DISPATCH_THREAD`` off, ``submit`` publishes on the caller's thread, one
message per job.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time

from django.conf import settings
from django.db import connection

logger = logging.getLogger(__name__)

_DRAIN_AT_EXIT_S = 5.0
MAX_IDS_PER_MESSAGE = 8


class JobDispatcher:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0
        self._thread: threading.Thread | None = None
        self._pid: int | None = None

    def submit(self, job_id: str) -> None:
        """Publish ``job_id``: now, on this thread, or with ``JOB_DISPATCH_THREAD`` soon, on the
        dispatcher thread. Call it after the row committed."""
        if not getattr(settings, "JOB_DISPATCH_THREAD", False):
            _send([job_id])
            return
        with self._lock:
            self._pending += 1
            self._ensure_thread()
        self._queue.put(job_id)

    def start(self) -> None:
        """Start the dispatcher thread now (with ``JOB_DISPATCH_THREAD``), not at the first
        submission: the web warm-up calls this, so no request pays for the thread's start."""
        if getattr(settings, "JOB_DISPATCH_THREAD", False):
            with self._lock:
                self._ensure_thread()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every submitted id has been sent (or its send failed). False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._pending:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def _ensure_thread(self) -> None:
        # A forked child inherits the object but not the thread: start a new one there.
        if self._thread is not None and self._thread.is_alive() and self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="job-dispatcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job_ids = [self._queue.get()]
            while len(job_ids) < MAX_IDS_PER_MESSAGE:
                try:
                    job_ids.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                _send(job_ids)
            finally:
                # The thread touches the DB only when a send fails; give that connection back
                # (to the pool) rather than hold it.
                if connection.connection is not None:
                    connection.close()
                with self._idle:
                    self._pending -= len(job_ids)
                    if not self._pending:
                        self._idle.notify_all()


def _send(job_ids: list[str]) -> None:
    from api.services.jobs import jobs_dispatch  # jobs.py imports this module

    jobs_dispatch(job_ids=job_ids)


dispatcher = JobDispatcher()


@atexit.register
def _drain_at_exit() -> None:
    if not dispatcher.flush(timeout=_DRAIN_AT_EXIT_S):
        logger.warning("Exiting with job messages unsent; the reconciler will send them")
