"""The engine in a process of its own, so that nothing else a worker does shares its GIL.

:class:`EngineProcess` offers :class:`JobHost`'s methods (``submit_many``, ``cancel``,
``hand_back``, ``drain``, ``heartbeat``...) to the worker, and keeps the one set of the jobs it
holds; the engine and its I/O thread (an :class:`~engine_worker.runtime.engine_side.EngineSide`:
model, engine thread, coalescer, no held set) run in a child started with multiprocessing's
*spawn* (mlx does not survive a fork; the parent never imports mlx). One duplex connection carries the messages of
:mod:`engine_worker.protocol`, each a small frozen dataclass pickled by multiprocessing:

* parent → child: :class:`Admit` (the jobs of one claim), :class:`Cancel`, :class:`HandBack`,
  :class:`Evict`, :class:`Stop`;
* child → parent: :class:`StepBatch` (the engine's outputs), :class:`WorkerHeartbeat` (every
  ``heartbeat_s``, the first one meaning "ready"), :class:`Refused` (a job the engine would not
  take, classified by the child's EngineSide) and :class:`Stopped`.

The parent's I/O thread receives them: it hands each batch to the sink, keeps the last heartbeat,
and between messages (at least every ``tick_s``) runs ``on_tick``. Supervision is one rule: if the
child dies, :meth:`EngineProcess.engine_running` turns False and the worker stops, handing its
jobs back to the queue; nothing restarts the child in place. If the parent dies, the child reads
the end of the connection and exits.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine_worker.protocol import (
    Admit,
    Cancel,
    Evict,
    HandBack,
    JobSpec,
    Refused,
    StepBatch,
    Stop,
    Stopped,
    WorkerHeartbeat,
)
from engine_worker.runtime.host import OnRefused, hold_fresh
from engine_worker.runtime.sink import OutputSink

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0  # loading a large model from a slow disk


@dataclass(frozen=True)
class ChildSpec:
    """What the child needs to build its engine; the engine's own settings come from the
    environment it inherits (``EngineConfig.from_env``)."""

    worker_id: str
    model_path: str
    stream_interval_s: float
    heartbeat_s: float
    model_name: str = ""  # the name in heartbeats; default: the model folder's name


class EngineChild:
    """The spawned engine process and this side of its connection, before any message is read.

    Spawned apart from :class:`EngineProcess` so that a worker can start it first, and set itself
    up while the child imports mlx-lm and loads the model (api/worker/early_engine.py)."""

    def __init__(self, spec: ChildSpec) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.spec = spec
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(child_conn, spec), name="engine", daemon=True)
        self.proc.start()
        child_conn.close()


class EngineProcess:
    def __init__(self, spec: ChildSpec, sink: OutputSink, *, on_tick: Callable[[], None] | None = None,
                 on_refused: OnRefused | None = None, tick_s: float = 0.5, child: EngineChild | None = None) -> None:
        """``child``: the engine process, already spawned with ``spec``; without it :meth:`start`
        spawns one."""
        if child is not None and child.spec != spec:
            raise ValueError("the engine process was spawned with another spec")
        self.spec = spec
        self._child = child
        self._sink = sink
        self._on_tick = on_tick
        self._on_refused = on_refused
        self._tick_s = tick_s
        self._held: dict[str, float] = {}
        self._lock = threading.Condition()
        self._send_lock = threading.Lock()
        self._publishing = threading.RLock()  # held while a batch is filtered and written
        self._closed = False
        self._alive = False
        self._beat: WorkerHeartbeat | None = None
        self._conn: Any = None
        self._proc: Any = None
        self._io = threading.Thread(target=self._receive, name="worker-io", daemon=True)

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the child (unless it was given) and wait for its first heartbeat (its engine runs);
        then start the I/O thread. Raises RuntimeError if the child dies or does not become ready
        in time."""
        child = self._child or EngineChild(self.spec)
        self._conn, self._proc = child.conn, child.proc
        deadline = time.monotonic() + START_TIMEOUT_S
        while self._beat is None:
            if not self._conn.poll(min(1.0, max(0.0, deadline - time.monotonic()))):
                if not self._proc.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"the engine process did not start (exit code {self._proc.exitcode})")
                continue
            message = self._conn.recv()
            if isinstance(message, WorkerHeartbeat):
                self._beat = message
        self._alive = True
        self._io.start()

    def drain(self, timeout: float) -> list[str]:
        """Stop admitting and wait up to ``timeout`` s for held jobs to finish (their finals
        written). Returns the jobs still running afterwards."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._closed = True
            while self._held and self._alive and time.monotonic() < deadline:
                self._lock.wait(min(0.25, max(0.0, deadline - time.monotonic())))
            return list(self._held)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the child once it has sent every output (its engine stopped), and the I/O thread
        once it has written them."""
        self._send(Stop())
        self._io.join(timeout)
        if self._proc is not None:
            self._proc.join(timeout)
            if self._proc.is_alive():
                logger.warning("the engine process did not stop in %.0f s; killing it", timeout)
                self._proc.kill()
                self._proc.join(5)

    # -- jobs ---------------------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> bool:
        """:meth:`submit_many` of one job: whether it was sent."""
        return bool(self.submit_many([spec]))

    def submit_many(self, specs: list[JobSpec]) -> list[str]:
        """Hand jobs to the engine, all in one message. Returns the ids sent: not those held
        already, none while this host is draining. A job the engine refuses comes back through
        ``on_refused``."""
        with self._lock:
            if self._closed:
                return []
            fresh = hold_fresh(self._held, specs)
        if fresh:
            self._send(Admit(tuple(fresh)))
        return [spec.job_id for spec in fresh]

    def cancel(self, job_id: str) -> bool:
        """Stop a held job: it ends with ``finish_reason="abort"`` and the text so far."""
        if not self.holds(job_id):
            return False
        self._send(Cancel(job_id))
        return True

    def hand_back(self, job_ids: list[str]) -> list[str]:
        """Abort held jobs without a final (they go back to the queue). Returns those released;
        once it returns, nothing more of theirs reaches the sink."""
        with self._publishing, self._lock:  # a batch being written finishes first; later ones skip these jobs
            released = [job_id for job_id in job_ids if self._held.pop(job_id, None) is not None]
            self._lock.notify_all()
        if released:
            self._send(HandBack(tuple(released)))
        return released

    def evict_cache_entry(self, key: str) -> bool:
        """Ask the child to drop one prefix-cache entry. True once asked: the outcome shows in the
        child's next heartbeat, which it sends right after."""
        self._send(Evict(key))
        return True

    def holds(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._held

    def held_jobs(self) -> list[str]:
        with self._lock:
            return list(self._held)

    def free_slots(self) -> int:
        """How many more jobs the engine's batch would run at once (its last heartbeat's capacity,
        less the jobs held here); 0 when it reports none."""
        capacity = self._beat.capacity if self._beat is not None else 0
        with self._lock:
            return max(0, capacity - len(self._held))

    def engine_running(self) -> bool:
        """False once the child has died or stopped."""
        return self._alive

    def heartbeat(self, worker_id: str) -> WorkerHeartbeat:
        """The child's latest heartbeat (it sends one every ``heartbeat_s``)."""
        assert self._beat is not None  # start() waited for the first
        return self._beat

    # -- the I/O thread -----------------------------------------------------------------------

    def _receive(self) -> None:
        next_tick = time.monotonic()
        while True:
            try:
                if self._conn.poll(max(0.0, next_tick - time.monotonic())):
                    if self._handle(self._conn.recv()):
                        break
            except (EOFError, OSError):
                logger.critical("the engine process is gone (exit code %s)", self._proc.exitcode)
                break
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + self._tick_s
                self._tick()
        with self._lock:
            self._alive = False
            self._lock.notify_all()
        self._tick()  # the duties notice the engine is gone

    def _handle(self, message: object) -> bool:
        """Act on one message of the child; True for the last one."""
        if isinstance(message, StepBatch):
            self._publish(message)
        elif isinstance(message, WorkerHeartbeat):
            self._beat = message
        elif isinstance(message, Refused):
            self._release(message.job_id)
            if self._on_refused is not None:
                self._on_refused(message.job_id, message.error, message.job_fault)
        elif isinstance(message, Stopped):
            return True
        return False

    def _publish(self, batch: StepBatch) -> None:
        """Hand the batch to the sink, less the outputs of jobs this host no longer holds: a job
        handed back may still have outputs in the connection, sent before the child read the
        HandBack, and its next attempt (on any worker) must not see them."""
        named = ({c.job_id for c in batch.chunks} | {f.job_id for f in batch.finals}
                 | {t.job_id for t in batch.first_tokens})
        with self._publishing:
            with self._lock:
                held = named & self._held.keys()
            if held != named:
                batch = StepBatch(chunks=tuple(c for c in batch.chunks if c.job_id in held),
                                  finals=tuple(f for f in batch.finals if f.job_id in held),
                                  first_tokens=tuple(t for t in batch.first_tokens if t.job_id in held))
                if not batch:
                    return
            try:
                self._sink.publish(batch)
            except Exception:  # a sink failure must not kill the worker's output path
                logger.exception("output sink failed for a batch of %s chunks, %s finals",
                                 len(batch.chunks), len(batch.finals))
        for final in batch.finals:
            self._release(final.job_id)

    def _release(self, job_id: str) -> None:
        with self._lock:
            self._held.pop(job_id, None)
            self._lock.notify_all()

    def _tick(self) -> None:
        if self._on_tick is None:
            return
        try:
            self._on_tick()
        except Exception:
            logger.exception("the worker's periodic duties failed; retrying at the next tick")

    def _send(self, message: object) -> None:
        try:
            with self._send_lock:
                self._conn.send(message)
        except (OSError, ValueError):  # the child is gone: the I/O thread reports it
            logger.warning("the engine process is gone; %s not sent", type(message).__name__)


# -- the child ------------------------------------------------------------------------------------

class _ConnectionSink:
    """The child's sink: each batch and heartbeat goes to the parent through the connection."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def publish(self, message: object) -> None:
        with self._lock:
            self._conn.send(message)


def serve(conn: Any, spec: ChildSpec) -> None:
    """The child's main: load the model, run the engine, obey the parent's messages until
    :class:`Stop` (or the parent is gone). Runs in a spawned process."""
    from engine_worker.common.config import EngineConfig
    from engine_worker.engine.core import EngineCore
    from engine_worker.runner.loader import context_length, load_model
    from engine_worker.runtime.engine_side import EngineSide

    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO"), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    model, tokenizer = load_model(spec.model_path)
    engine = EngineCore(model, tokenizer, EngineConfig.from_env())
    engine.start()
    out = _ConnectionSink(conn)
    beats = _Beats(spec, out)
    # No set of held jobs here: the parent's is the one (it filters what comes back by it).
    host = EngineSide(engine, out, on_refused=out.publish, context_length=context_length(model),
                      model_name=spec.model_name or os.path.basename(os.path.normpath(spec.model_path)),
                      stream_interval_s=spec.stream_interval_s, on_tick=lambda: beats.tick(host),
                      tick_s=min(0.5, spec.heartbeat_s))
    host.start()
    beats.send(host)  # ready
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the parent is gone: nothing can be delivered any more
                break
            if isinstance(message, Stop):
                break
            _obey(host, message)
            if isinstance(message, Evict):
                beats.send(host)  # the dashboard sees the entry gone without waiting a period
    finally:
        host.stop()
        engine.stop()
        engine.close()
        try:
            out.publish(Stopped())
        except (OSError, ValueError):
            pass
    # Everything is written and the engine is closed: leave without the interpreter's teardown of
    # mlx's and OpenBLAS's native threads, which can abort a process at exit.
    os._exit(0)


def _obey(host: Any, message: object) -> None:
    if isinstance(message, Admit):
        host.admit(list(message.jobs))  # a refusal reaches the parent through on_refused
    elif isinstance(message, Cancel):
        host.cancel(message.job_id)
    elif isinstance(message, HandBack):
        host.hand_back(list(message.job_ids))
    elif isinstance(message, Evict):
        host.evict_cache_entry(message.key)


class _Beats:
    """Sends the child's heartbeat every ``heartbeat_s``, from its I/O thread; stops the child when
    its engine thread has died (the parent then sees the connection end)."""

    def __init__(self, spec: ChildSpec, out: _ConnectionSink) -> None:
        self._spec = spec
        self._out = out
        self._next = 0.0

    def tick(self, host: Any) -> None:
        if not host.engine_running():
            logger.critical("the engine thread is not running; the engine process exits")
            os._exit(1)
        if time.monotonic() >= self._next:
            self.send(host)

    def send(self, host: Any) -> None:
        self._next = time.monotonic() + self._spec.heartbeat_s
        self._out.publish(host.heartbeat(self._spec.worker_id))
