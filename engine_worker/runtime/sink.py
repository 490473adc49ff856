"""Where the worker's output goes: an interface the Django side implements.

The engine thread never calls a sink. The I/O thread calls :meth:`OutputSink.publish` with one
:class:`StepBatch` at a time, in order; a sink may block (Redis, database), which only delays
the next batch, which then folds more steps. A sink raises :class:`SinkError` (or lets a client
library's error out) for a failed write; the runtime logs it and carries on with the next batch.
"""

from __future__ import annotations

import threading
from typing import Protocol

from engine_worker.protocol import FinalResult, OutputChunk, StepBatch


class SinkError(Exception):
    """A batch (or part of it) could not be written."""


class OutputSink(Protocol):
    def publish(self, batch: StepBatch) -> None: ...


class MemorySink:
    """Keeps every batch in memory: tests and in-process benchmarks."""

    def __init__(self) -> None:
        self.batches: list[StepBatch] = []
        self._cond = threading.Condition()

    def publish(self, batch: StepBatch) -> None:
        with self._cond:
            self.batches.append(batch)
            self._cond.notify_all()

    def chunks(self, job_id: str) -> list[OutputChunk]:
        with self._cond:
            return [c for b in self.batches for c in b.chunks if c.job_id == job_id]

    def final(self, job_id: str) -> FinalResult | None:
        with self._cond:
            return self._final(job_id)

    def wait_final(self, job_id: str, timeout: float) -> FinalResult | None:
        """The job's :class:`FinalResult`, waiting up to ``timeout`` seconds (None on timeout)."""
        with self._cond:
            self._cond.wait_for(lambda: self._final(job_id) is not None, timeout)
            return self._final(job_id)

    def _final(self, job_id: str) -> FinalResult | None:
        return next((f for b in self.batches for f in b.finals if f.job_id == job_id), None)
