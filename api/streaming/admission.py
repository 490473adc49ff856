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

Claims in a burst: every claim costs the worker process about a millisecond of CPU on the GPU
host (the UPDATE's round trip, its rows, the engine submits), taken from the engine thread's GIL.
Woken by each commit's notice, a 32-job burst made 12-19 claims of 1-6 jobs. A job claimed in the
middle of an engine step waits for that step's end anyway, so with ``min_interval_s``
(``WORKER_CLAIM_INTERVAL_MS``) a claim that follows another one sooner than that waits, and then
takes everything that came meanwhile: fewer, larger claims. A job that comes after a quiet spell
is claimed at once. It is off by default: at 4 ms a burst made 11-12 claims, but end to end the
service ran the same (docs/benchmarks.md, twelfth pass).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

_STOP = object()
_WAKE = object()


class AdmissionThread:
    def __init__(self, admit_batch: Callable[..., bool | None], *, max_batch: int = 64,
                 min_interval_s: float = 0.0) -> None:
        """``admit_batch(ids)``, or ``admit_batch(ids, woken=True)`` when a wake-up came with them;
        it returns whether it claimed (went to the database). ``min_interval_s``: the least time
        from the start of one claiming batch to the start of the next; what arrives meanwhile
        waits and goes in that next batch (see "Claims in a burst" above)."""
        self._admit_batch = admit_batch
        self._max_batch = max_batch
        self._min_interval_s = min_interval_s
        self._last_claim = float("-inf")
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
            wait = self._last_claim + self._min_interval_s - time.monotonic()
            if wait > 0 and not self._closed.is_set():
                time.sleep(wait)  # then take everything that arrived meanwhile
            started = time.monotonic()
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
            claimed = False
            try:
                if woken:
                    claimed = bool(self._admit_batch(batch, woken=True))
                elif batch:
                    claimed = bool(self._admit_batch(batch))
            except Exception:  # the ids stay queued in the database; the reconciler resends them
                logger.exception("admission of %s jobs failed", len(batch))
                claimed = True  # it may have reached the database
            if claimed:
                self._last_claim = started
            if stopping:
                return
