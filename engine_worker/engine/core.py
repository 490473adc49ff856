"""EngineCore: the seed's engine API around one engine thread that owns mlx.

Threads:

* the **engine thread** creates the generator (and its mlx stream), and is the only thread that
  steps the scheduler. It blocks on a condition variable while there is nothing to do and wakes
  at once when a request or abort arrives. Commands from other threads (:class:`Submit` of a
  request, :class:`Cancel` of one: :mod:`engine_worker.protocol`'s verbs) wait in a queue and are
  applied at the start of the next step, never in the middle of one.
* **asyncio callers** (``add_request``, ``stream_outputs``, ``generate``) receive outputs through a
  per-request collector; the engine thread hands each loop one callback per step.
* **synchronous hosts** (the worker runtime) use ``submit``/``abort`` and an output listener,
  which the engine thread calls after every step with that step's outputs. A listener runs on the
  engine thread, inside the step loop: it must only enqueue (no I/O, no blocking), or it stalls
  every request.

``start()`` and ``stop()`` are synchronous and also awaitable (``await engine.start()`` as in the
seed). ``with EngineCore(...) as engine:`` starts the engine and closes it on exit. The engine
thread destroys its mlx streams before it ends (mlx aborts the process at exit otherwise), and an
``atexit`` hook stops and joins engines left running, so a process using the engine exits cleanly.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from engine_worker.cache.protocol import PrefixCacheBackend
from engine_worker.common.config import EngineConfig, SchedulerConfig
from engine_worker.common.errors import DuplicateRequest, EngineClosed, EngineError, EngineFatalError
from engine_worker.common.request import Request, RequestOutput, SamplingParams
from engine_worker.engine.async_api import AsyncRequestAPI, Done
from engine_worker.engine.collectors import AsyncCollector, SyncWaiter, deliver
from engine_worker.engine.heap import freeze_startup_heap
from engine_worker.engine.ownership import acquire_model, release_model
from engine_worker.protocol import Cancel, Submit
from engine_worker.runner import device_memory
from engine_worker.runner.buffer_release import BufferRelease
from engine_worker.runner.generator import release_thread_streams
from engine_worker.sched.memory import MemoryBudget
from engine_worker.sched.scheduler import Scheduler, SchedulerOutput

logger = logging.getLogger(__name__)

# How long the loop waits after a step that ran nothing (only SSD-deferred requests were left):
# a disk read of a cache entry takes milliseconds, and a busy loop would count a miss per retry.
_DEFERRED_POLL_S = 0.005

OutputListener = Callable[[list[RequestOutput]], None]

_live_engines: weakref.WeakSet[EngineCore] = weakref.WeakSet()


class EngineCore(AsyncRequestAPI):
    """Runs a :class:`Scheduler` on a dedicated engine thread (seed API)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: EngineConfig | None = None,
        engine_id: str | None = None,
        force_model_ownership: bool = True,
        *,
        prefix_cache: PrefixCacheBackend | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or EngineConfig()
        self._engine_id = engine_id or str(uuid.uuid4())
        scheduler_config = self.config.scheduler_config or SchedulerConfig()
        #: Everything this engine holds on the device stays within it (engine_worker.sched.memory).
        self.memory_budget = MemoryBudget.for_model(model, scheduler_config, self.config.gpu_memory_utilization)
        acquire_model(model, self, force_model_ownership)
        self.scheduler = Scheduler(model, tokenizer, scheduler_config, prefix_cache=prefix_cache,
                                   memory_budget=self.memory_budget)
        self._cond = threading.Condition()
        self._commands: deque[Submit[Request] | Cancel] = deque()
        self._step_lock = threading.Lock()  # held while stepping and by readers of scheduler state
        self._live: set[str] = set()  # submitted, not yet finished
        self._collectors: dict[str, AsyncCollector] = {}
        self._waiters: dict[str, SyncWaiter] = {}
        self._listeners: list[OutputListener] = []
        self._idle_step = False  # the last step admitted and generated nothing
        self._release = BufferRelease()  # hands mlx's cached free buffers back to the device
        self._thread: threading.Thread | None = None
        self._stop_requested = False
        self._closed = False
        self._fatal: BaseException | None = None
        self._start_time: float | None = None
        self._steps_executed = 0
        self.memory_limit_bytes: int | None = None  # mlx's memory limit, the budget, once started
        self.loop_iterations = 0  # engine-loop iterations; flat while idle (no polling)
        _live_engines.add(self)

    @property
    def engine_id(self) -> str:
        return self._engine_id

    # ------------------------------------------------------------------ life cycle

    def start(self) -> Done:
        """Start the engine thread (idempotent). Returns an awaitable, for the seed's ``await``."""
        freeze_startup_heap()  # the first start in a process: model and tokenizer are loaded by now
        while True:
            with self._cond:
                if self._closed:
                    raise EngineClosed("engine is closed")
                thread = self._thread
                if thread is None or not thread.is_alive():
                    self._stop_requested = False
                    self._fatal = None
                    self._start_time = time.time()
                    self._thread = threading.Thread(target=self._run, name=f"engine-{self._engine_id[:8]}",
                                                    daemon=True)
                    self._thread.start()
                    return Done()
                if not self._stop_requested or thread is threading.current_thread():
                    return Done()
            # A stopping thread is still finishing its last requests: let it, then start afresh.
            thread.join()

    def stop(self, timeout: float | None = None) -> Done:
        """Stop the engine thread and wait for it to exit. Requests still in flight finish with
        ``finish_reason="abort"``. Safe to call repeatedly; awaitable like ``start()``."""
        with self._cond:
            thread = self._thread
            self._stop_requested = True
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        return Done()

    def __enter__(self) -> EngineCore:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def is_running(self) -> bool:
        thread = self._thread
        return (thread is not None and thread.is_alive() and not self._stop_requested
                and self._fatal is None)

    def close(self) -> None:
        """Stop, drop every request and cache, and release the model. Idempotent."""
        if self._closed:
            return
        self.stop()
        with self._step_lock:
            self.scheduler.deep_reset()
        with self._cond:
            self._closed = True
            self._collectors.clear()
            self._waiters.clear()
            self._live.clear()
        release_model(self.model, self)

    # ------------------------------------------------------------------ the engine thread

    def _run(self) -> None:
        try:
            budget = self.memory_budget
            # The allocator keeps one step's working memory, and more as larger steps are measured.
            device_memory.apply_allocator_limits(budget.total, budget.step_bytes or budget.allocator_cache)
            self.memory_limit_bytes = budget.total
            while True:
                with self._cond:
                    while not (self._commands or self._stop_requested or self.scheduler.has_requests()):
                        self._cond.wait()
                    if self._idle_step and not (self._commands or self._stop_requested):
                        # The last step ran nothing: only requests deferred for a background SSD
                        # read are left. Give the reader a moment instead of spinning; a new
                        # command still wakes the loop at once.
                        self._cond.wait(_DEFERRED_POLL_S)
                    self.loop_iterations += 1
                    if self._stop_requested:
                        break
                    commands = self._commands
                    self._commands = deque()
                outputs = self._step(commands)
                self._release.after_step(busy=not self._idle_step, finished=any(o.finished for o in outputs))
                if outputs:
                    self._dispatch(outputs)
        except BaseException as exc:
            self._fatal = exc
            logger.exception("engine thread failed; failing every request")
        finally:
            try:
                self._shutdown()
            finally:
                release_thread_streams()

    def _step(self, commands: deque[Submit[Request] | Cancel]) -> list[RequestOutput]:
        scheduler = self.scheduler
        refused: list[RequestOutput] = []
        with self._step_lock:
            for command in commands:
                if isinstance(command, Cancel):
                    scheduler.abort_request(command.job_id)
                    continue
                request = command.job
                try:
                    scheduler.add_request(request)
                except DuplicateRequest as exc:
                    # Only reachable if the scheduler still tracks the id; _register refuses
                    # live duplicates before they are queued. The caller still gets a final.
                    refused.append(RequestOutput(request.request_id, finished=True, finish_reason="error",
                                                 error=str(exc)))
            if not scheduler.has_requests():
                self._idle_step = False
                return refused
            result: SchedulerOutput = scheduler.step()
            self._steps_executed += 1
            self._idle_step = not (result.has_work or result.outputs or refused)
            for rid in result.finished_request_ids:
                scheduler.remove_finished_request(rid)
        return result.outputs + refused if refused else result.outputs

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for listener in self._listeners:
            try:
                listener(outputs)
            except Exception:  # a broken listener must not take the engine down
                logger.exception("output listener %r failed", listener)
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[AsyncCollector, RequestOutput]]] = {}
        with self._cond:
            collectors, waiters, live = self._collectors, self._waiters, self._live
            for out in outputs:
                rid = out.request_id
                if out.finished:
                    live.discard(rid)
                    waiter = waiters.pop(rid, None)
                    if waiter is not None:
                        waiter.put(out)
                collector = collectors.get(rid)
                if collector is not None:
                    if out.finished and collector.abandoned:
                        del collectors[rid]
                    by_loop.setdefault(collector.loop, []).append((collector, out))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(deliver, items)
            except RuntimeError:  # the caller's loop is closed: nobody is listening any more
                logger.debug("dropping outputs for a closed event loop")

    def _shutdown(self) -> None:
        """On the engine thread: give every live request a final output, then close the generator
        here (it belongs to this thread)."""
        with self._cond:
            self._commands = deque()
            live = list(self._live)
        outputs: list[RequestOutput] = []
        with self._step_lock:
            scheduler = self.scheduler
            if self._fatal is None:
                for rid in live:
                    # False: its Submit never reached the scheduler.
                    if not scheduler.abort_request(rid):
                        outputs.append(_closing_output(rid, None))
                if scheduler.has_requests():
                    outputs.extend(scheduler.step().outputs)
                for rid in live:
                    scheduler.remove_finished_request(rid)
            else:
                outputs = [_closing_output(rid, self._fatal) for rid in live]
            try:
                # After a failure the scheduler's state is suspect: drop it all, so a restart
                # begins clean. reset() also closes the generator, which belongs to this thread.
                scheduler.reset() if self._fatal is not None else scheduler.close()
            except Exception:  # the thread is ending either way; the failure is logged
                logger.exception("closing the generator failed")
        if outputs:
            self._dispatch(outputs)

    # ------------------------------------------------------------------ submitting (any thread)

    def _enqueue(self, command: Submit[Request] | Cancel) -> None:
        self._commands.append(command)
        self._cond.notify()

    def _register(self, request: Request, collector: AsyncCollector | None = None,
                  waiter: SyncWaiter | None = None) -> None:
        rid = request.request_id
        with self._cond:
            if self._closed:
                raise EngineClosed("engine is closed")
            if self._fatal is not None:
                raise EngineFatalError(f"engine thread failed: {self._fatal!r}")
            if rid in self._live or rid in self._collectors:
                raise DuplicateRequest(rid)
            self._live.add(rid)
            if collector is not None:
                self._collectors[rid] = collector
            if waiter is not None:
                self._waiters[rid] = waiter
            self._enqueue(Submit(request))
        if not self.is_running():
            self.start()

    def submit(self, request: Request) -> str:
        """Queue a request from any thread, without an event loop. Its outputs reach the output
        listeners. Raises :class:`DuplicateRequest` while a request with that id is live."""
        self._register(request)
        return request.request_id

    def submit_many(self, requests: list[Request]) -> list[Exception | None]:
        """:meth:`submit` of each request, all queued under one hold of the command lock, so the
        engine thread takes them into one step. Returns, per request, the error that refused it
        (None: queued); one refusal does not stop the others."""
        errors: list[Exception | None] = []
        with self._cond:  # re-entrant: _register takes it again
            for request in requests:
                try:
                    self._register(request)
                    errors.append(None)
                except EngineError as exc:
                    errors.append(exc)
        return errors

    def abort(self, request_id: str) -> bool:
        """Abort from any thread; applied at the start of the next step. False if not live."""
        with self._cond:
            if request_id not in self._live:
                return False
            self._enqueue(Cancel(request_id))
        return True

    def add_output_listener(self, fn: OutputListener) -> None:
        """Call ``fn(outputs)`` on the engine thread after every step that produced outputs.
        ``fn`` must only enqueue: it runs inside the engine loop."""
        self._listeners = [*self._listeners, fn]

    def generate_batch_sync(
        self, prompts: list[str | list[int]], sampling_params: SamplingParams | None = None
    ) -> list[RequestOutput]:
        """Run ``prompts`` to the end and return their final outputs in order. Blocks; works
        whether or not the engine thread runs (it is started if needed). Other callers' requests
        keep running and keep their outputs."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("generate_batch_sync cannot be called on the engine thread")
        sp = sampling_params or SamplingParams()
        requests = [Request(str(uuid.uuid4()), p, sp) for p in prompts]
        waiter = SyncWaiter([r.request_id for r in requests])
        for r in requests:
            self._register(r, waiter=waiter)
        waiter.wait()
        return [waiter.finals[r.request_id] for r in requests]

    # ------------------------------------------------------------------ stats and caches

    def get_stats(self) -> dict[str, Any]:
        with self._step_lock:
            rows = self.scheduler.get_running_requests_info()
            sched = self.scheduler.get_stats()
        return {
            "running": self.is_running(),
            "uptime_seconds": time.time() - self._start_time if self._start_time else 0.0,
            "steps_executed": self._steps_executed,
            "active_requests": len(self._live),
            "stream_interval": self.config.stream_interval,
            "requests": rows,
            **sched,
        }

    def get_cache_stats(self) -> dict[str, Any] | None:
        with self._step_lock:
            return self.scheduler.get_cache_stats()

    def list_cache_entries(self) -> list[dict[str, Any]]:
        """Operator view: one row per prefix-cache entry (between engine steps)."""
        with self._step_lock:
            return self.scheduler.list_cache_entries()

    def evict_cache_entry(self, key: str) -> bool:
        """Drop one prefix-cache entry by ``key_hash`` (between engine steps); False if unknown."""
        with self._step_lock:
            return self.scheduler.evict_cache_entry(key)

    def save_cache_to_disk(self, cache_dir: str) -> bool:
        with self._step_lock:
            return self.scheduler.save_cache_to_disk(cache_dir)

    def load_cache_from_disk(self, cache_dir: str) -> int:
        with self._step_lock:
            return self.scheduler.load_cache_from_disk(cache_dir)

    def clear_runtime_caches(self) -> dict[str, bool]:
        with self._step_lock:
            return self.scheduler.clear_runtime_caches()

    def clear_prefix_cache(self) -> None:
        with self._step_lock:
            self.scheduler.clear_prefix_cache()


def _closing_output(request_id: str, fatal: BaseException | None) -> RequestOutput:
    if fatal is None:
        return RequestOutput(request_id=request_id, finished=True, finish_reason="abort")
    return RequestOutput(request_id=request_id, finished=True, finish_reason="error",
                         error=f"engine failed: {fatal!r}", engine_failed=True)


@atexit.register
def _stop_engines_at_exit() -> None:
    # mlx can abort the process at exit while a non-main thread still holds its streams.
    for engine in list(_live_engines):
        engine.stop(timeout=10.0)
