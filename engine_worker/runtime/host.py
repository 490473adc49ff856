"""JobHost: runs jobs on an in-process EngineCore and streams their outputs to a sink.

Threads (one of them owns the model):

* the engine thread (EngineCore's own) steps the scheduler; after each step it calls our output
  listener, which only enqueues;
* the I/O thread (:class:`IOThread`) folds outputs into one chunk per job per batch, calls the
  sink (Redis, database) and, between batches, the worker's periodic duties (``on_tick``);
* callers (the Celery consumer's thread, the periodic duties) use :meth:`submit`, :meth:`cancel`,
  :meth:`hand_back`, :meth:`heartbeat`, which never block on the engine.

A job the engine will not start is refused here, once, for every host: :func:`refusal` says whether
the fault is the job's (it cannot run anywhere) or the engine's, and ``on_refused`` hands that to
the worker (through the connection, when the host runs in an engine process of its own).

This module imports neither Django nor Celery; the service plugs in through :class:`OutputSink`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from engine_worker.common.errors import RequestError
from engine_worker.common.request import Request, RequestOutput
from engine_worker.protocol import Cancel, HandBack, JobSpec, Refused, Submit, WorkerHeartbeat
from engine_worker.runtime.convert import spec_to_request
from engine_worker.runtime.heartbeat import build_heartbeat
from engine_worker.runtime.io_thread import IOThread
from engine_worker.runtime.sink import OutputSink

logger = logging.getLogger(__name__)


# on_refused(job_id, error, job_fault): the worker's answer to a job the engine would not start.
OnRefused = Callable[[str, str, bool], None]


def refusal(job_id: str, exc: Exception) -> Refused:
    """How a job the engine would not start is refused: the job's own fault when it cannot run
    anywhere (a ``RequestError``, or settings the request types reject with ``ValueError`` or
    ``TypeError``), else the engine's (``EngineClosed``...: another worker may run it)."""
    job_fault = isinstance(exc, RequestError | ValueError | TypeError)
    return Refused(job_id, str(exc), job_fault=job_fault)


class HostedEngine(Protocol):
    """The part of EngineCore's sync host API the runtime uses."""

    def add_output_listener(self, fn: Any) -> None: ...
    def submit(self, request: Request) -> Any: ...
    def submit_many(self, requests: list[Request]) -> list[Exception | None]: ...
    def abort(self, request_id: str) -> Any: ...
    def get_stats(self) -> dict[str, Any]: ...
    def get_cache_stats(self) -> dict[str, Any] | None: ...
    def list_cache_entries(self) -> list[dict[str, Any]]: ...
    def evict_cache_entry(self, key: str) -> bool: ...
    def is_running(self) -> bool: ...


class Host(Protocol):
    """A host of jobs on one engine, as the worker uses it: :class:`JobHost` (the engine in this
    process) or :class:`~engine_worker.runtime.engine_process.EngineProcess` (in a child)."""

    def start(self) -> None: ...
    def submit_many(self, specs: list[JobSpec]) -> list[str]:
        """Hand jobs to the engine, in one hand-over. Returns the ids of those that run here: not
        one the host holds already, none while it is draining, not one its engine refused at once.
        A refusal, at once or later (an engine in a process of its own answers after this
        returns), reaches the host's ``on_refused``."""
        ...

    def cancel(self, job_id: str) -> bool: ...
    def hand_back(self, job_ids: list[str]) -> list[str]: ...
    def holds(self, job_id: str) -> bool: ...
    def held_jobs(self) -> list[str]: ...
    def free_slots(self) -> int: ...
    def drain(self, timeout: float) -> list[str]: ...
    def stop(self) -> None: ...
    def engine_running(self) -> bool: ...
    def heartbeat(self, worker_id: str) -> WorkerHeartbeat: ...

    def evict_cache_entry(self, key: str) -> bool:
        """Ask the engine to drop one prefix-cache entry (``key_hash`` of a heartbeat's
        ``cache_entries`` row); its next heartbeat no longer lists it. Returns the engine's answer
        (False: no such entry) where the host has it at once, else True once the request is sent."""
        ...


class JobHost:
    """Admits :class:`JobSpec` s into one engine, many at once (continuous batching)."""

    def __init__(self, engine: HostedEngine, sink: OutputSink, *, model_name: str = "",
                 context_length: int | None = None, stream_interval_s: float = 0.0,
                 on_tick: Callable[[], None] | None = None, tick_s: float = 0.5,
                 on_refused: OnRefused | None = None) -> None:
        """``stream_interval_s``: the least time between two sink writes of ordinary deltas
        (first tokens, finals and commands go at once); 0 writes after every step. ``on_tick``:
        the worker's periodic duties, run on the I/O thread at least every ``tick_s`` seconds.
        ``on_refused``: what a refused job is reported to (without one, it is logged)."""
        self.engine = engine
        self.model_name = model_name
        self.context_length = context_length
        self._on_refused = on_refused
        self._held: dict[str, float] = {}  # job id -> admitted at
        self._lock = threading.Condition()
        self._io = IOThread(sink, self._finished, interval_s=stream_interval_s, on_tick=on_tick, tick_s=tick_s)
        self._started = False
        self._closed = False

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the I/O thread and register the output listener (the engine runs already)."""
        if self._started:
            return
        self._io.start()
        self.engine.add_output_listener(self._on_outputs)
        self._started = True

    def drain(self, timeout: float) -> list[str]:
        """Stop admitting and wait up to ``timeout`` s for held jobs to finish (their finals are
        written). Returns the jobs still running afterwards."""
        with self._lock:
            self._closed = True
            # A dead engine finishes nothing: its jobs are handed back at once. Nothing notifies
            # this lock when the engine dies, hence the short wait slices.
            deadline = time.monotonic() + timeout
            while self._held and self.engine.is_running():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(min(left, 0.25))
            return list(self._held)

    def stop(self, flush_timeout: float = 10.0) -> None:
        """Flush pending outputs to the sink and stop the I/O thread. The engine is the caller's."""
        if self._started:
            self._io.flush(flush_timeout)
            self._io.stop(flush_timeout)
            self._started = False

    # -- jobs ---------------------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> bool:
        """:meth:`submit_many` of one job: whether it started."""
        return bool(self.submit_many([spec]))

    def submit_many(self, specs: list[JobSpec]) -> list[str]:
        """Admit jobs, all in one hand-over to the engine (its next step takes them together).
        Returns the ids of those started. One is not started when this host already holds it or
        is draining (nothing happens), or when the engine will not start it: it is released and
        refused (:func:`refusal`), and the others still start."""
        with self._lock:
            if self._closed:
                return []
            fresh = list({spec.job_id: spec for spec in specs if spec.job_id not in self._held}.values())
            now = time.time()
            for spec in fresh:
                self._held[spec.job_id] = now
        requests, refused = [], []
        for spec in fresh:
            # Queued before the engine has it: the FIFO queue then orders the start before any output.
            self._io.put(Submit(spec))
            try:
                requests.append(spec_to_request(spec))
            except (ValueError, TypeError) as exc:
                refused.append((spec.job_id, exc))
        errors = self.engine.submit_many(requests) if requests else []
        refused += [(r.request_id, exc) for r, exc in zip(requests, errors, strict=True) if exc is not None]
        for job_id, exc in refused:
            self._refuse(job_id, exc)
        failed = {job_id for job_id, _ in refused}
        return [spec.job_id for spec in fresh if spec.job_id not in failed]

    def _refuse(self, job_id: str, exc: Exception) -> None:
        self._io.put(HandBack((job_id,)))
        self._finished(job_id)
        refused = refusal(job_id, exc)
        if not refused.job_fault:
            logger.error("the engine could not start job %s: %s", job_id, exc)
        if self._on_refused is not None:
            self._on_refused(refused.job_id, refused.error, refused.job_fault)
        else:
            logger.warning("job %s refused, with nobody to tell: %s", job_id, refused.error)

    def cancel(self, job_id: str) -> bool:
        """Stop a held job: the engine drops it at its next step and the job ends with
        ``finish_reason="abort"`` and the text streamed so far. False if not held here."""
        if not self.holds(job_id):
            return False
        self.engine.abort(job_id)
        self._io.put(Cancel(job_id))
        return True

    def hand_back(self, job_ids: list[str]) -> list[str]:
        """Abort held jobs without a final (they go back to the queue). Returns those released."""
        released = []
        for job_id in job_ids:
            if self.holds(job_id):
                self.engine.abort(job_id)
                self._io.put(HandBack((job_id,)))
                self._finished(job_id)
                released.append(job_id)
        return released

    def holds(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._held

    def held_jobs(self) -> list[str]:
        with self._lock:
            return list(self._held)

    def wait_idle(self, timeout: float) -> bool:
        """True once no job is held (every final was handed to the sink)."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._held, timeout)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every output so far reached the sink."""
        return self._io.flush(timeout)

    def free_slots(self) -> int:
        """How many more jobs the engine's batch would run at once (its ``max_running``, less the
        jobs held here); 0 when it reports none."""
        capacity = int(self.engine.get_stats().get("max_running", 0))
        with self._lock:
            return max(0, capacity - len(self._held))

    def engine_running(self) -> bool:
        """False once the engine thread has stopped (shut down, or died of a fatal error)."""
        return self.engine.is_running()

    # -- stats --------------------------------------------------------------------------------

    def heartbeat(self, worker_id: str) -> WorkerHeartbeat:
        return build_heartbeat(
            worker_id=worker_id,
            model=self.model_name,
            stats=self.engine.get_stats(),
            cache=self.engine.get_cache_stats(),
            context_length=self.context_length,
            cache_entries=self.engine.list_cache_entries(),
        )

    def evict_cache_entry(self, key: str) -> bool:
        """Drop one prefix-cache entry, from every tier, between two engine steps (the caller
        waits for the step in progress). False when the cache holds no such entry."""
        evicted = self.engine.evict_cache_entry(key)
        logger.info("prefix-cache entry %s %s", key, "evicted" if evicted else "not found")
        return evicted

    # -- internals ----------------------------------------------------------------------------

    def _on_outputs(self, outputs: list[RequestOutput]) -> None:
        # Engine thread: enqueue only. A job the engine dropped because the engine itself failed
        # gets no final: it stays held, and the worker hands it back to the queue (drain returns
        # at once once the engine is down), so another worker runs it instead of it failing.
        if any(out.engine_failed for out in outputs):
            outputs = [out for out in outputs if not out.engine_failed]
        self._io.on_outputs(outputs)

    def _finished(self, job_id: str) -> None:
        with self._lock:
            self._held.pop(job_id, None)
            self._lock.notify_all()
