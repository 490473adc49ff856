"""The engine worker's admission thread: job ids in, claimed batches out.

``run_job`` (the Celery consumer's thread) only hands a job id over and returns, so a burst of
messages is consumed at broker speed. This thread takes every id waiting at that moment and
passes them to ``admit_batch`` together: one claim UPDATE per batch, instead of two database
round trips per job fighting the engine thread for the GIL one by one. (Clearing an earlier
attempt's stream rides with the job's first output batch, in the sink.)

The message is acknowledged when ``run_job`` returns, before the claim. That is safe because the
database row is the truth: a job whose worker died in between is still ``queued``, and the
reconciler sends it again once its claim deadline passes. On an orderly stop, ids that were never
claimed are returned so the worker can send them straight back to the queue.

:meth:`AdmissionThread.wake` (the database noticed that jobs were queued, queue_listener.py)
asks for a claim of the queue's head with no id in hand: ``admit_batch(ids, woken=True)``. Any
number of wake-ups waiting together make one.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

_STOP = object()
_WAKE = object()


class AdmissionThread:
    def __init__(self, admit_batch: Callable[..., None], *, max_batch: int = 64) -> None:
        """``admit_batch(ids)``, or ``admit_batch(ids, woken=True)`` when a wake-up came with them."""
        self._admit_batch = admit_batch
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-admission", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, job_id: str) -> bool:
        """Queue a job for admission; False once stopping (the caller gives it back)."""
        if self._closed.is_set():
            return False
        self._queue.put(job_id)
        return True

    def wake(self) -> None:
        """Jobs were queued: claim from the queue's head at the next batch (none once stopping)."""
        if not self._closed.is_set():
            self._queue.put(_WAKE)

    def stop(self, timeout: float) -> list[str]:
        """Finish the batch in progress, stop, and return the ids that were never admitted."""
        self._closed.set()
        self._queue.put(_STOP)
        if self._thread.is_alive():
            self._thread.join(timeout)
        left: list[str] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return left
            if item is not _STOP and item is not _WAKE:
                left.append(str(item))

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch: list[str] = []
            woken = stopping = False
            item = first
            while True:
                if item is _STOP:
                    stopping = True
                    break
                if item is _WAKE:
                    woken = True
                else:
                    batch.append(str(item))
                if len(batch) >= self._max_batch:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            try:
                if woken:
                    self._admit_batch(batch, woken=True)
                elif batch:
                    self._admit_batch(batch)
            except Exception:  # the ids stay queued in the database; the reconciler resends them
                logger.exception("admission of %s jobs failed", len(batch))
            if stopping:
                return
