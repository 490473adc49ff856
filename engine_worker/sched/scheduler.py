"""The scheduler: the seed's ``Scheduler`` API over mlx-lm's ``BatchGenerator``.

A state machine with no I/O. ``step()`` is the one step function: hand out the outputs of
requests that ended between steps, admit waiting requests within the budgets
(``max_num_seqs``/generator capacity, the generator's free prefill slots,
``max_num_batched_tokens``, the worker's memory budget, policy order; none while first tokens are
due and holding pays, see :mod:`engine_worker.sched.pacer`; under the priority policy a full batch
gives way to more urgent requests), fit the batch to the memory budget, run one generator step,
turn its responses into :class:`RequestOutput`s. A step that runs out of device memory is
survived: the batch waits again and runs at most half as large.

One class, composed of its collaborators: the :class:`~engine_worker.sched.batch.Batch` (the
running set, its maps and the runner), :class:`~engine_worker.sched.admission.Admission` (who
joins it at a step), :func:`~engine_worker.sched.outputs.step_outputs` (a step's responses as
outputs), :class:`~engine_worker.sched.exits.Exits` (how a request finishes, fails or is
aborted), the :class:`~engine_worker.sched.preemption.Preemptor` (requests back to wait, for
memory or priority), the memory guard (:mod:`engine_worker.sched.memory`) and the prefix cache's
seam and hooks (:mod:`engine_worker.cache`).

Not thread-safe: one thread calls every method (``EngineCore`` runs it on its engine thread and
hands other threads' requests and aborts over through its command queue).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine_worker.cache.hooks import CacheLifecycle
from engine_worker.cache.protocol import PrefixCacheBackend
from engine_worker.cache.seam import PrefixSeam, default_backend
from engine_worker.common.config import DEFAULT_GPU_MEMORY_UTILIZATION, SchedulerConfig, SchedulingPolicy
from engine_worker.common.errors import DuplicateRequest, RequestError
from engine_worker.common.request import Request, RequestOutput, RequestStatus
from engine_worker.runner import device_memory
from engine_worker.runner.detokenizer import detokenizer_factory
from engine_worker.runner.generator import BatchRunner
from engine_worker.runner.grammar import ConstrainedRows
from engine_worker.runner.loader import context_length, drop_model_caches, vocab_size
from engine_worker.runner.sampling import SamplingFactory, eos_token_ids
from engine_worker.runner.text_stream import TextStream
from engine_worker.runner.urgent_lane import LanedRunner, in_lane
from engine_worker.sched.admission import Admission, RequestValidator
from engine_worker.sched.batch import Batch
from engine_worker.sched.exits import Exits
from engine_worker.sched.memory import MemoryBudget, MemoryGuard
from engine_worker.sched.outputs import step_outputs
from engine_worker.sched.pacer import AdmissionPacer
from engine_worker.sched.preemption import Preemptor
from engine_worker.sched.stats import SchedulerCounters, mtp_status, request_rows
from engine_worker.sched.waiting_queue import WaitingQueue

logger = logging.getLogger(__name__)

__all__ = ["Scheduler", "SchedulerConfig", "SchedulerOutput", "SchedulingPolicy"]


@dataclass
class SchedulerOutput:
    """What one ``step()`` did. ``num_scheduled_tokens`` counts prompt tokens actually sent to
    prefill for the requests admitted in this step (prefix-cache hits excluded)."""

    scheduled_request_ids: list[str] = field(default_factory=list)
    num_scheduled_tokens: int = 0
    finished_request_ids: set[str] = field(default_factory=set)
    outputs: list[RequestOutput] = field(default_factory=list)
    has_work: bool = False


class Scheduler:
    """Continuous-batching request manager (seed API: ``Scheduler(model, tokenizer, config)``).

    ``prefix_cache`` plugs a cache back end in (see :mod:`engine_worker.cache.protocol`); by
    default the one the config's cache fields ask for is built (none when
    ``enable_prefix_cache`` is False). ``runner_factory`` replaces the mlx generator (tests with
    scripted tokens). ``memory_budget`` is the worker's (:mod:`engine_worker.sched.memory`); by
    default ``gpu_memory_utilization``'s default share of the device. The scheduler keeps its
    batch and prefix cache within it; mlx's allocator limits are the engine's to set.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: SchedulerConfig | None = None,
        *,
        prefix_cache: PrefixCacheBackend | None = None,
        runner_factory: Callable[[Any, SchedulerConfig], BatchRunner] | None = None,
        max_model_len: int | None = None,
        memory_budget: MemoryBudget | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config = config or SchedulerConfig()
        self.memory_budget = memory_budget or MemoryBudget.for_model(model, config, DEFAULT_GPU_MEMORY_UTILIZATION)
        self._guard = MemoryGuard(self.memory_budget, config.prefill_batch_size, config.effective_prefill_step_size)
        # "is None", not "or": a back end may be falsy when empty (it defines __len__).
        self.prefix_cache: PrefixCacheBackend = (
            default_backend(model, config, self.memory_budget.prefix_cache) if prefix_cache is None
            else prefix_cache
        )
        self._cache = PrefixSeam(self.prefix_cache)
        self._lifecycle = CacheLifecycle(self._cache, config.mid_prefill_save_interval, config.max_kv_size)
        self._runner_factory = runner_factory or LanedRunner
        self.max_model_len = max_model_len or context_length(model)
        self._validator = RequestValidator(tokenizer, self.max_model_len, vocab_size(model))
        self._sampling = SamplingFactory(eos_token_ids(tokenizer), ConstrainedRows(tokenizer, vocab_size(model)))
        self._new_detokenizer = detokenizer_factory(tokenizer)
        self._pacer = AdmissionPacer()
        self.counters = SchedulerCounters()
        self.mtp_status = mtp_status(model, config)

        self.waiting = WaitingQueue(config.policy)
        self.requests: dict[str, Request] = {}
        self.finished_req_ids: set[str] = set()
        # The runner is made on the thread that first steps (its mlx stream is that thread's).
        self._batch = Batch(lambda: self._runner_factory(self.model, self.config))
        # The seed's attributes are the batch's own tables, which it only ever changes in place.
        self.running = self._batch.running
        self.request_id_to_uid = self._batch.request_id_to_uid
        self.uid_to_request_id = self._batch.uid_to_request_id
        self._exits = Exits(self.requests, self.waiting, self._batch, self._cache, self._lifecycle, self.counters)
        self._preemptor = Preemptor(config, self._batch, self.waiting, self._guard, self._cache, self._exits,
                                    self.counters)
        self._admission = Admission(config, self.waiting, self._batch, self._guard, self._preemptor, self._cache,
                                    self._lifecycle, self._exits)

    # ----------------------------------------------------------------- seed accessors

    @property
    def runner(self) -> BatchRunner | None:
        """The runner stepping the batch (``None`` before the first step and after a close)."""
        return self._batch.runner

    @property
    def batch_generator(self) -> Any:
        """The live mlx-lm ``BatchGenerator`` (``None`` before the first step)."""
        return self.runner.generator if self.runner is not None else None

    @property
    def ssd_wait(self) -> Any:
        """The SSD wait policy (``max_wait_s``) while a cache is active, else ``None``."""
        return self._lifecycle.ssd_wait

    def has_requests(self) -> bool:
        return bool(self.waiting or self.running or self._exits.pending)

    def get_num_waiting(self) -> int:
        return len(self.waiting)

    def get_num_running(self) -> int:
        return len(self.running)

    def get_request(self, request_id: str) -> Request | None:
        return self.requests.get(request_id)

    def remove_finished_request(self, request_id: str) -> Request | None:
        """Forget a request; only finished ones can be forgotten (a live one stays tracked)."""
        request = self.requests.get(request_id)
        if request is not None and request.is_finished():
            return self.requests.pop(request_id)
        return None

    # ----------------------------------------------------------------- requests in and out

    def add_request(self, request: Request) -> None:
        """Queue a request.

        Raises :class:`DuplicateRequest` if the id is still known (the first request is not
        touched). A request that cannot run (bad prompt, tokenizer error, multimodal input,
        prompt longer than the context) is accepted and finishes at the next step with
        ``finish_reason="error"`` and ``error`` set, without affecting any other request.
        """
        if request.request_id in self.requests:
            raise DuplicateRequest(request.request_id)
        self.requests[request.request_id] = request
        try:
            self._validator.prepare(request)
        except RequestError as exc:
            self._exits.fail(request, str(exc))
            return
        self.waiting.push(request)

    def abort_request(self, request_id: str) -> bool:
        """Abort now: a waiting request is dropped and never runs; a running one leaves the batch
        before the next step. Its final output (``finish_reason="abort"``) goes out with the next
        step. Returns False if the request is unknown or already finished."""
        return self._exits.abort(request_id)

    # ----------------------------------------------------------------- admission

    def _admits_this_step(self) -> bool:
        """Whether this step hands the generator new prompts: not when it returns first tokens
        and holding admission for one decode step gains them more than it costs the queue
        (:mod:`engine_worker.sched.pacer`)."""
        if not self.running:
            return True
        return not self._pacer.hold(due=self._batch.first_tokens_due, waiting=len(self.waiting))

    def _insert(self, request: Request) -> bool:
        sp = request.sampling_params
        cache = request.prompt_cache
        # A preempted request resumes: its prompt and output so far are its new prompt.
        resumed = request.status == RequestStatus.PREEMPTED
        self._batch.ensure_runner()  # outside the try: a runner that cannot be made is not this request's fault
        try:
            if request.remaining_tokens is None:
                raise ValueError("its prompt was not looked up in the prefix cache")
            uid = self._batch.insert(
                request.remaining_tokens,
                urgent=self._urgent(request),
                max_tokens=sp.max_tokens - request.num_output_tokens,
                cache=cache,
                all_tokens=request.prompt_ids[: request.cached_tokens] if cache is not None else None,
                sampler=self._sampling.sampler(sp, request.output_token_ids),
                logits_processors=self._sampling.logits_processors(sp, self._exits.processor_guard(request)),
                stop_sequences=self._sampling.stop_sequences(sp),
            )
        except (ValueError, TypeError) as exc:
            # The generator validates inserts before touching its state, so nothing else is hit.
            logger.warning("request %s could not be inserted: %s", request.request_id, exc)
            self._exits.fail(request, f"could not start generation: {exc}")
            return False
        request.prompt_cache = None  # the generator merged (copied) it
        request.status = RequestStatus.RUNNING
        stream = self._batch.streams.get(request.request_id) if resumed else None  # its text goes on
        self._batch.join(request, uid, stream or TextStream(self._new_detokenizer(), sp.stop or ()))
        c = self.counters
        c.total_prefilled_tokens += len(request.remaining_tokens)
        if not resumed:
            c.total_prompt_tokens += request.num_prompt_tokens
            c.total_cached_tokens += request.cached_tokens
            self._lifecycle.admitted(request)
        return True

    def _urgent(self, request: Request) -> bool:
        """Under ``PRIORITY``, a request more urgent than the least urgent request in the batch (the
        one a full batch would give way to it) starts in the urgent lane, where its first token does
        not wait for the batch's steps (:mod:`engine_worker.runner.urgent_lane`)."""
        if self.config.policy is not SchedulingPolicy.PRIORITY:
            return False
        batch = [r.priority for r in self.running.values() if not in_lane(r.batch_uid)]
        return bool(batch) and request.priority < max(batch)

    # ----------------------------------------------------------------- the step

    def step(self, max_retries: int = 1) -> SchedulerOutput:
        """Admit, run one generator step, and return this step's outputs.

        ``max_retries`` is accepted for seed compatibility and unused: a failed generator step is
        never retried on state that may be corrupt. One that ran out of device memory queues its
        batch again (the next steps run it at most half as large); any other failure fails the
        requests in that batch (each gets an error output).
        """
        out = SchedulerOutput()
        outputs = self._exits.take()
        if self.waiting and self._admits_this_step():
            out.scheduled_request_ids, out.num_scheduled_tokens = self._admission.admit(self._insert)
            outputs.extend(self._exits.take())  # requests that failed to insert
        if self.running and self._guard.bounds_kv:
            self._preemptor.fit_batch()
            outputs.extend(self._exits.take())  # a request alone too big for the budget
        if self.running:
            out.has_work = True
            responses = self._run_generator()
            outputs.extend(self._exits.take())  # the requests of a failed step or logits processor
            if responses:
                self.counters.total_generated_tokens += len(responses)
                outputs.extend(step_outputs(responses, self._batch, self._exits))
        self.counters.num_steps += 1
        out.outputs = outputs
        finished = out.finished_request_ids
        for o in outputs:
            if o.finished:
                finished.add(o.request_id)
        self.finished_req_ids = finished
        return out

    def _run_generator(self) -> Sequence[Any]:
        """One generator step; its responses, or none when it failed. The batch's state is unknown
        after a failed step: the generator is dropped. Out of device memory, the batch waits again
        and runs smaller; any other failure fails the requests in it. The queue keeps being served."""
        prompt_work = bool(self._batch.prefilling)  # inserted or prefilling: the step admits or prefills
        started = time.perf_counter()
        self._guard.allocator.before_step()
        try:
            responses = self._batch.step()
        except Exception as exc:
            self.counters.num_step_errors += 1
            if device_memory.is_allocation_failure(exc):
                self._preemptor.recover_from_allocation_failure(exc)
            else:
                logger.exception("generation step failed; failing %d running requests", len(self.running))
                self._exits.fail_running("generation step failed")
            responses = ()
        else:
            self._guard.step_succeeded(self.config.max_running)
            self._guard.allocator.after_step()
            self._pacer.record(time.perf_counter() - started, prompt_work=prompt_work)
            self._lifecycle.after_step(self._batch.ensure_runner())  # mid-prefill saves; no-op for short prompts
        self._exits.fail_processor_errors()
        return responses

    # ----------------------------------------------------------------- stats (seed API)

    def get_running_requests_info(self) -> list[dict[str, Any]]:
        """Dashboard rows with exactly the seed's fields: waiting requests, then running ones."""
        return request_rows(list(self.waiting), list(self.running.values()), time.time())

    def get_stats(self) -> dict[str, Any]:
        c = self.counters
        budget = self.memory_budget
        stats: dict[str, Any] = {
            "num_waiting": len(self.waiting),
            "num_running": len(self.running),
            # Requests the batch may run at once now (the generator's capacity, lowered while the
            # memory guard caps it): beyond it, admitted work waits.
            "max_running": self._guard.cap(self.config.max_running),
            "num_requests_processed": c.num_requests_processed,
            "total_prompt_tokens": c.total_prompt_tokens,
            "total_completion_tokens": c.total_completion_tokens,
            "counters": {**c.as_dict(), "num_cache_errors": self._cache.errors},
        }
        # mlx's allocator now, and the budget with its parts (the allocator cache is cache_bytes).
        stats["memory"] = mem = device_memory.memory_stats()
        mem.update(budget_bytes=budget.total, weights_bytes=budget.weights, kv_bytes=self._batch.kv_bytes() or 0,
                   prefix_cache_bytes=self._cache.bytes_used,
                   prefix_cache_limit_bytes=budget.prefix_cache if self._cache.active else 0,
                   cache_limit_bytes=self._guard.allocator.limit)
        stats.update(device_memory.seed_memory_keys(mem))
        if self.mtp_status is not None:
            stats["mtp"] = dict(self.mtp_status)
        cache_stats = self._cache.stats()
        if cache_stats is not None:
            stats[self.prefix_cache.name] = cache_stats
        return stats

    def get_cache_stats(self) -> dict[str, Any] | None:
        return self._cache.stats()

    def list_cache_entries(self) -> list[dict[str, Any]]:
        """Operator view: one row per prefix-cache entry (key_hash, tokens, bytes, tier,
        hit_count, last_used, quantized); empty without a cache."""
        return self._lifecycle.list_entries()

    def evict_cache_entry(self, key: str) -> bool:
        """Drop one prefix-cache entry (every tier) by its ``key_hash``; False if unknown."""
        return self._lifecycle.evict(key)

    # ----------------------------------------------------------------- caches and resets (seed API)

    def clear_runtime_caches(self) -> dict[str, bool]:
        """Clear the prefix cache and the allocator cache; requests are untouched."""
        result = {"paged_cache": False, "memory_aware_cache": False, "prefix_cache": False}
        if self._cache.clear():
            result[self.prefix_cache.name] = True
        device_memory.clear_allocator_cache()
        return result

    def clear_prefix_cache(self) -> None:
        self._cache.clear()

    def save_cache_to_disk(self, cache_dir: str) -> bool:
        return self._cache.save(cache_dir)

    def load_cache_from_disk(self, cache_dir: str) -> int:
        return self._cache.load(cache_dir)

    def close_ssd_tier(self) -> None:
        """Flush and stop the prefix cache's SSD tier, if it has one (``deep_reset`` does it too)."""
        self._cache.close()

    def reset(self) -> None:
        """Abort every request, drop the generator, clear the caches and the counters' queues."""
        # Detached while aborting: the generator is discarded, so nothing is removed from it and
        # no aborted prefix is stored (the cache is cleared below; after a failure it is suspect).
        batch = self._batch
        runner, batch.runner = batch.runner, None
        for rid in list(self.requests):
            self.abort_request(rid)
        batch.runner = runner
        self.requests.clear()
        self.waiting.clear()
        batch.clear()
        self._exits.take()
        self.finished_req_ids = set()
        self.close()
        self.clear_runtime_caches()

    def deep_reset(self) -> None:
        """``reset()`` plus dropping every cache reference the model may hold, and closing the
        prefix cache's disk tier (it flushes pending writes)."""
        self.reset()
        self._cache.close()
        drop_model_caches(self.model)
        gc.collect()

    def close(self) -> None:
        """Release the generator (on the thread that stepped it)."""
        self._batch.close()
