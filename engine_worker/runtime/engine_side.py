"""EngineSide: an engine and the I/O thread that streams its outputs, with no set of held jobs.

The engine process runs one (engine_process.py's ``serve``): the worker's :class:`EngineProcess`
keeps the one set of held jobs, on its side of the pipe, and filters what comes back by it. Here
the engine's own live requests and the I/O thread's coalescer are all the state there is: a cancel
or a hand-back of a job the engine no longer runs changes nothing. :class:`JobHost` (the engine in
the worker's own process: tests, in-process benchmarks) adds the held set to one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from engine_worker.common.errors import RequestError
from engine_worker.common.request import RequestOutput
from engine_worker.protocol import Cancel, HandBack, JobSpec, Refused, Submit, WorkerHeartbeat
from engine_worker.runtime.convert import spec_to_request
from engine_worker.runtime.heartbeat import build_heartbeat
from engine_worker.runtime.io_thread import IOThread
from engine_worker.runtime.sink import OutputSink

logger = logging.getLogger(__name__)


def refusal(job_id: str, exc: Exception) -> Refused:
    """How a job the engine would not start is refused: the job's own fault when it cannot run
    anywhere (a ``RequestError``, or settings the request types reject with ``ValueError`` or
    ``TypeError``), else the engine's (``EngineClosed``...: another worker may run it)."""
    job_fault = isinstance(exc, RequestError | ValueError | TypeError)
    return Refused(job_id, str(exc), job_fault=job_fault)


class EngineSide:
    def __init__(self, engine, sink: OutputSink, *, on_refused: Callable[[Refused], None],  # noqa: ANN001
                 on_finished: Callable[[str], None] = lambda job_id: None, model_name: str = "",
                 context_length: int | None = None, stream_interval_s: float = 0.0,
                 on_tick: Callable[[], None] | None = None, tick_s: float = 0.5) -> None:
        """``engine``: a :class:`~engine_worker.runtime.host.HostedEngine`. ``on_refused``: each job
        the engine would not start, classified. ``on_finished(job_id)``: after a job's final was
        handed to the sink. The rest as :class:`JobHost`'s."""
        self.engine = engine
        self.model_name = model_name
        self.context_length = context_length
        self._on_refused = on_refused
        self._io = IOThread(sink, on_finished, interval_s=stream_interval_s, on_tick=on_tick, tick_s=tick_s)

    def start(self) -> None:
        """Start the I/O thread and register the output listener (the engine runs already)."""
        self._io.start()
        self.engine.add_output_listener(self._on_outputs)

    def stop(self, flush_timeout: float = 10.0) -> None:
        """Flush pending outputs to the sink and stop the I/O thread. The engine is the caller's."""
        self._io.flush(flush_timeout)
        self._io.stop(flush_timeout)

    def flush(self, timeout: float) -> bool:
        return self._io.flush(timeout)

    def admit(self, specs: list[JobSpec]) -> list[str]:
        """Start jobs in one hand-over to the engine (its next step takes them together); returns
        the ids started. Each refused one is dropped from the output path and reported."""
        requests, refused = [], []
        for spec in specs:
            # Queued before the engine has it: the FIFO queue then orders the start before any output.
            self._io.put(Submit(spec))
            try:
                requests.append(spec_to_request(spec))
            except (ValueError, TypeError) as exc:
                refused.append(refusal(spec.job_id, exc))
        errors = self.engine.submit_many(requests) if requests else []
        refused += [refusal(r.request_id, exc) for r, exc in zip(requests, errors, strict=True) if exc is not None]
        for answer in refused:
            self._io.put(HandBack((answer.job_id,)))
            if not answer.job_fault:
                logger.error("the engine could not start job %s: %s", answer.job_id, answer.error)
            self._on_refused(answer)
        failed = {answer.job_id for answer in refused}
        return [spec.job_id for spec in specs if spec.job_id not in failed]

    def cancel(self, job_id: str) -> None:
        """The job ends at the engine's next step with ``finish_reason="abort"`` and its text so far."""
        self.engine.abort(job_id)
        self._io.put(Cancel(job_id))

    def hand_back(self, job_ids: list[str]) -> None:
        """The jobs stop without a final; nothing more of theirs is written."""
        for job_id in job_ids:
            self.engine.abort(job_id)
        self._io.put(HandBack(tuple(job_ids)))

    def evict_cache_entry(self, key: str) -> bool:
        """Drop one prefix-cache entry, from every tier, between two engine steps (the caller
        waits for the step in progress). False when the cache holds no such entry."""
        evicted = self.engine.evict_cache_entry(key)
        logger.info("prefix-cache entry %s %s", key, "evicted" if evicted else "not found")
        return evicted

    def engine_running(self) -> bool:
        return self.engine.is_running()

    def heartbeat(self, worker_id: str) -> WorkerHeartbeat:
        return build_heartbeat(worker_id=worker_id, model=self.model_name, stats=self.engine.get_stats(),
                               cache=self.engine.get_cache_stats(), context_length=self.context_length,
                               cache_entries=self.engine.list_cache_entries())

    def _on_outputs(self, outputs: list[RequestOutput]) -> None:
        # Engine thread: enqueue only. A job the engine dropped because the engine itself failed
        # gets no final: it stays held, and the worker hands it back to the queue (drain returns
        # at once once the engine is down), so another worker runs it instead of it failing.
        if any(out.engine_failed for out in outputs):
            outputs = [out for out in outputs if not out.engine_failed]
        self._io.on_outputs(outputs)
