"""JobHost: runs jobs on an in-process EngineCore and streams their outputs to a sink; the
:class:`Host` protocol that it and the engine in a process of its own (engine_process.py) offer.

Threads (one of them owns the model):

* the engine thread (EngineCore's own) steps the scheduler; after each step it calls the output
  listener, which only enqueues;
* the I/O thread (:class:`IOThread`) folds outputs into one chunk per job per batch, calls the
  sink (Redis, database) and, between batches, the worker's periodic duties (``on_tick``);
* callers (the Celery consumer's thread, the periodic duties) use :meth:`JobHost.submit_many`,
  ``cancel``, ``hand_back``, ``heartbeat``, which never block on the engine.

The engine and its I/O thread are an :class:`EngineSide` (engine_side.py, also what the engine
process runs); a JobHost adds the set of jobs it holds. A job the engine will not start is
classified there, once, for every host (``refusal``: the job's fault, or the engine's), and
``on_refused`` hands that to the worker.

This module imports neither Django nor Celery; the service plugs in through :class:`OutputSink`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from engine_worker.common.request import Request
from engine_worker.protocol import JobSpec, Refused, WorkerHeartbeat
from engine_worker.runtime.engine_side import EngineSide
from engine_worker.runtime.sink import OutputSink

logger = logging.getLogger(__name__)


# on_refused(job_id, error, job_fault): the worker's answer to a job the engine would not start.
OnRefused = Callable[[str, str, bool], None]


def hold_fresh(held: dict[str, float], specs: list[JobSpec]) -> list[JobSpec]:
    """The specs not in ``held`` (one per job id), entered into it with the time now: a host's
    admission under its own lock."""
    fresh = list({spec.job_id: spec for spec in specs if spec.job_id not in held}.values())
    now = time.time()
    for spec in fresh:
        held[spec.job_id] = now
    return fresh


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
    """Admits :class:`JobSpec` s into one engine, many at once (continuous batching): an
    :class:`EngineSide` and the set of jobs it holds."""

    def __init__(self, engine: HostedEngine, sink: OutputSink, *, model_name: str = "",
                 context_length: int | None = None, stream_interval_s: float = 0.0,
                 on_tick: Callable[[], None] | None = None, tick_s: float = 0.5,
                 on_refused: OnRefused | None = None) -> None:
        """``stream_interval_s``: the least time between two sink writes of ordinary deltas
        (first tokens, finals and commands go at once); 0 writes after every step. ``on_tick``:
        the worker's periodic duties, run on the I/O thread at least every ``tick_s`` seconds.
        ``on_refused``: what a refused job is reported to (without one, it is logged)."""
        self.engine = engine
        self._on_refused = on_refused
        self._held: dict[str, float] = {}  # job id -> admitted at
        self._lock = threading.Condition()
        self._side = EngineSide(engine, sink, on_refused=self._refused, on_finished=self._finished,
                                model_name=model_name, context_length=context_length,
                                stream_interval_s=stream_interval_s, on_tick=on_tick, tick_s=tick_s)
        self._started = False
        self._closed = False

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the I/O thread and register the output listener (the engine runs already)."""
        if not self._started:
            self._side.start()
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
            self._side.stop(flush_timeout)
            self._started = False

    # -- jobs ---------------------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> bool:
        """:meth:`submit_many` of one job: whether it started."""
        return bool(self.submit_many([spec]))

    def submit_many(self, specs: list[JobSpec]) -> list[str]:
        """Admit jobs, all in one hand-over to the engine (its next step takes them together).
        Returns the ids of those started. One is not started when this host already holds it or
        is draining (nothing happens), or when the engine will not start it: it is released and
        refused (engine_side.refusal), and the others still start."""
        with self._lock:
            if self._closed:
                return []
            fresh = hold_fresh(self._held, specs)
        return self._side.admit(fresh) if fresh else []

    def _refused(self, answer: Refused) -> None:
        self._finished(answer.job_id)
        if self._on_refused is not None:
            self._on_refused(answer.job_id, answer.error, answer.job_fault)
        else:
            logger.warning("job %s refused, with nobody to tell: %s", answer.job_id, answer.error)

    def cancel(self, job_id: str) -> bool:
        """Stop a held job: the engine drops it at its next step and the job ends with
        ``finish_reason="abort"`` and the text streamed so far. False if not held here."""
        if not self.holds(job_id):
            return False
        self._side.cancel(job_id)
        return True

    def hand_back(self, job_ids: list[str]) -> list[str]:
        """Abort held jobs without a final (they go back to the queue). Returns those released."""
        released = [job_id for job_id in job_ids if self.holds(job_id)]
        if released:
            self._side.hand_back(released)
            for job_id in released:
                self._finished(job_id)
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
        return self._side.flush(timeout)

    def free_slots(self) -> int:
        """How many more jobs the engine's batch would run at once (its ``max_running``, less the
        jobs held here); 0 when it reports none."""
        capacity = int(self.engine.get_stats().get("max_running", 0))
        with self._lock:
            return max(0, capacity - len(self._held))

    def engine_running(self) -> bool:
        """False once the engine thread has stopped (shut down, or died of a fatal error)."""
        return self._side.engine_running()

    def heartbeat(self, worker_id: str) -> WorkerHeartbeat:
        return self._side.heartbeat(worker_id)

    def evict_cache_entry(self, key: str) -> bool:
        """Drop one prefix-cache entry, from every tier, between two engine steps (the caller
        waits for the step in progress). False when the cache holds no such entry."""
        return self._side.evict_cache_entry(key)

    def _finished(self, job_id: str) -> None:
        with self._lock:
            self._held.pop(job_id, None)
            self._lock.notify_all()
