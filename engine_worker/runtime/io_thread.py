"""The worker's I/O thread: everything between the engine thread and the outside world.

The engine thread only appends its step outputs to a queue (the output listener). This thread
takes whatever has accumulated, folds it with :class:`ChunkCoalescer` into one
:class:`StepBatch` and hands that to the sink, so the sink's Redis/database round trips happen
once per batch, off the engine thread, and never per token. Commands from other threads
(:class:`~engine_worker.protocol.Submit`, ``Cancel``, ``HandBack``: a new job to follow, one to end
with an abort, some to drop without a final) travel through the same FIFO queue, which orders
them with respect to the outputs: a job is followed before its first output can arrive.

Between batches, and at least every ``tick_s`` when idle, it calls ``on_tick``: the worker's
periodic duties (heartbeat, lease renewal, cancellations from outside) run here too, so one
thread does all of the worker's I/O.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine_worker.common.request import RequestOutput
from engine_worker.protocol import Cancel, FinalResult, HandBack, StepBatch, Submit
from engine_worker.runtime.coalesce import ChunkCoalescer
from engine_worker.runtime.sink import OutputSink

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Barrier:
    event: threading.Event


_STOP = object()


class IOThread:
    """Owns the coalescer and calls the sink. ``on_finished(job_id)`` runs after a job's final
    was handed to the sink (or was handed back), so "no jobs held" means "all finals written"."""

    def __init__(self, sink: OutputSink, on_finished: Callable[[str], None], *, interval_s: float = 0.0,
                 on_tick: Callable[[], None] | None = None, tick_s: float = 0.5) -> None:
        """``on_tick`` is called from this thread between batches, at least every ``tick_s``
        seconds; it must not raise (an exception is logged and the thread goes on)."""
        self._sink = sink
        self._on_finished = on_finished
        self._interval_s = interval_s
        self._on_tick = on_tick
        self._tick_s = tick_s
        self._last_publish = 0.0
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._wake = threading.Event()  # set when something urgent is queued
        self._coalescer = ChunkCoalescer()
        # Named apart from the worker's own I/O thread (EngineProcess's "worker-io"), which receives
        # this thread's batches when the engine runs in a process of its own.
        self._thread = threading.Thread(target=self._run, name="engine-io", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, item: object) -> None:
        self._queue.put(item)
        self._wake.set()  # commands are urgent

    def on_outputs(self, outputs: list[RequestOutput]) -> None:
        """The engine's output listener: runs on the engine thread, so it only enqueues, and wakes
        the I/O thread early only for a first token or a final (a job's first output carries all
        of its tokens so far)."""
        self._queue.put(outputs)
        if any(out.finished or out.completion_tokens <= len(out.new_token_ids) for out in outputs):
            self._wake.set()

    def flush(self, timeout: float) -> bool:
        """Wait until everything enqueued so far was handed to the sink."""
        event = threading.Event()
        self._queue.put(Barrier(event))
        return event.wait(timeout)

    def stop(self, timeout: float) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            try:
                items = [self._queue.get(timeout=self._tick_s)]
            except queue.Empty:
                self._tick()
                continue
            self._take_waiting(items)
            if self._interval_s > 0 and not self._urgent(items):
                self._fold_until_due(items)
            stopping = self._process(items)
            self._tick()

    def _tick(self) -> None:
        if self._on_tick is None:
            return
        try:
            self._on_tick()
        except Exception:
            logger.exception("the worker's periodic duties failed; retrying at the next tick")

    def _fold_until_due(self, items: list[object]) -> None:
        """Ordinary deltas wait until ``interval_s`` after the previous write, folding the steps
        in between: fewer, larger chunks for every process downstream. Whatever is urgent ends the
        wait as soon as it arrives: a job admitted meanwhile must not have its first token held back
        by the other jobs' interval."""
        self._wake.clear()
        self._take_waiting(items)  # what arrived before the clear
        if self._urgent(items):
            return
        remaining = self._last_publish + self._interval_s - time.monotonic()
        if remaining > 0:
            # Plain outputs do not wake this thread: with a step every few ms, waking for each
            # would take the GIL from the engine thread once per step.
            self._wake.wait(remaining)
        self._take_waiting(items)

    def _take_waiting(self, items: list[object]) -> None:
        while True:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                return

    def _urgent(self, items: list[object]) -> bool:
        """Commands, finals and a job's output until its first text is out (TTFT) never wait for
        the interval. Until the first text, not the first token: a first token can bring no text (a
        character split over tokens, or only the leading space the detokenizer trims), and its job
        would then wait a whole interval for its first delta."""
        for item in items:
            if not isinstance(item, list):
                return True
            for out in item:
                if out.finished or self._coalescer.awaits_first_text(out.request_id):
                    return True
        return False

    def _process(self, items: list[object]) -> bool:
        steps: list[list[RequestOutput]] = []
        finals: list[FinalResult] = []
        barriers: list[threading.Event] = []
        stopping = False
        for item in items:
            if isinstance(item, list):
                steps.append(item)
                continue
            # A command applies after the outputs that arrived before it.
            if steps:
                self._publish(self._coalescer.fold(steps, finals))
                steps, finals = [], []
            if isinstance(item, Submit):
                spec = item.job
                self._coalescer.track(spec.job_id, len(spec.prompt_token_ids), spec.first_seq)
            elif isinstance(item, Cancel):
                final = self._coalescer.cancel(item.job_id)
                if final is not None:
                    finals.append(final)
            elif isinstance(item, HandBack):
                for job_id in item.job_ids:
                    self._coalescer.forget(job_id)
            elif isinstance(item, Barrier):
                barriers.append(item.event)
            elif item is _STOP:
                stopping = True
        if steps or finals:
            self._publish(self._coalescer.fold(steps, finals))
        for event in barriers:
            event.set()
        return stopping

    def _publish(self, batch: StepBatch) -> None:
        if batch:
            self._last_publish = time.monotonic()
            try:
                self._sink.publish(batch)
            except Exception:  # a sink failure must not kill the worker's output path
                logger.exception("output sink failed for a batch of %s chunks, %s finals",
                                 len(batch.chunks), len(batch.finals))
        for final in batch.finals:
            self._on_finished(final.job_id)
