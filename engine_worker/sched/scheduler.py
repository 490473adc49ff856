"""The scheduler: the seed's ``Scheduler`` API over mlx-lm's ``BatchGenerator``.

A state machine with no I/O. ``step()`` is the one step function: apply queued outputs, admit
waiting requests within the budgets (``max_num_seqs``/generator capacity, the generator's free
prefill slots, ``max_num_batched_tokens``, the worker's memory budget, policy order; none while
first tokens are due and holding pays, see :mod:`engine_worker.sched.pacer`; under the
priority policy a full batch gives way to more urgent requests), fit the batch
to the memory budget (preempting if it must, see :mod:`engine_worker.sched.memory`), run one
generator step, turn its responses into :class:`RequestOutput`s. A step that runs out of device
memory is survived: the batch waits again and runs at most half as large.

This file holds admission and the step; the class's other parts are mixins, one file each: how a
request leaves the batch (:mod:`engine_worker.sched.exits`), the memory budget and preemption
(:mod:`engine_worker.sched.preemption`), stats, caches and resets (:mod:`engine_worker.sched.ops`).

Not thread-safe: one thread calls every method (``EngineCore`` runs it on its engine thread and
hands other threads' requests and aborts over through queues).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine_worker.cache.hooks import CacheLifecycle
from engine_worker.cache.protocol import PrefixCacheBackend
from engine_worker.cache.seam import PrefixSeam, default_backend
from engine_worker.common.config import DEFAULT_GPU_MEMORY_UTILIZATION, SchedulerConfig, SchedulingPolicy
from engine_worker.common.errors import DuplicateRequest, RequestError
from engine_worker.common.request import Request, RequestOutput, RequestStatus, step_output
from engine_worker.runner import device_memory
from engine_worker.runner.detokenizer import detokenizer_factory
from engine_worker.runner.generator import BatchRunner
from engine_worker.runner.loader import context_length, vocab_size
from engine_worker.runner.logprobs import token_logprobs
from engine_worker.runner.sampling import SamplingFactory, eos_token_ids
from engine_worker.runner.text_stream import TextStream
from engine_worker.runner.urgent_lane import LanedRunner, in_lane
from engine_worker.sched.admission import RequestValidator
from engine_worker.sched.exits import BatchExits
from engine_worker.sched.memory import MemoryBudget, MemoryGuard
from engine_worker.sched.ops import SchedulerOps
from engine_worker.sched.pacer import AdmissionPacer
from engine_worker.sched.preemption import BatchMemory, sequence_tokens
from engine_worker.sched.stats import SchedulerCounters, mtp_status
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


class Scheduler(BatchExits, BatchMemory, SchedulerOps):
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
        self.config = config or SchedulerConfig()
        self.memory_budget = memory_budget or MemoryBudget.for_model(model, self.config,
                                                                     DEFAULT_GPU_MEMORY_UTILIZATION)
        self._guard = MemoryGuard(self.memory_budget, self.config.prefill_batch_size,
                                  self.config.effective_prefill_step_size)
        # "is None", not "or": a back end may be falsy when empty (it defines __len__).
        self.prefix_cache: PrefixCacheBackend = (
            default_backend(model, self.config, self.memory_budget.prefix_cache) if prefix_cache is None
            else prefix_cache
        )
        self._cache = PrefixSeam(self.prefix_cache)
        self._lifecycle = CacheLifecycle(self._cache, self.config.mid_prefill_save_interval,
                                         self.config.max_kv_size)
        self._runner_factory = runner_factory or LanedRunner
        self.runner: BatchRunner | None = None
        self.max_model_len = max_model_len or context_length(model)
        self._validator = RequestValidator(tokenizer, self.max_model_len, vocab_size(model))

        self.waiting = WaitingQueue(self.config.policy)
        self.running: dict[str, Request] = {}
        self.requests: dict[str, Request] = {}
        self.finished_req_ids: set[str] = set()
        self.request_id_to_uid: dict[str, int] = {}
        self.uid_to_request_id: dict[int, str] = {}
        self._streams: dict[str, TextStream] = {}
        self._live_by_uid: dict[int, tuple[Request, TextStream]] = {}  # the hot path's one lookup
        self._logprobs_by_uid: dict[int, int] = {}  # uids whose requests ask for log probabilities: k
        self._pending_outputs: list[RequestOutput] = []
        # Generator uids inserted whose prompt has not ended yet: they hold the generator's
        # prefill slots (``prefill_batch_size``). And how many prompts the last step ended: this
        # step returns their first tokens (see ``_admits_this_step``).
        self._prefilling: set[int] = set()
        self._first_tokens_due = 0
        self._pacer = AdmissionPacer()
        self._processor_errors: dict[str, BaseException] = {}  # filled during a generator step
        self._sampling = SamplingFactory(eos_token_ids(tokenizer))
        self._new_detokenizer = detokenizer_factory(tokenizer)
        self.counters = SchedulerCounters()
        self.mtp_status = mtp_status(model, self.config)

    # ----------------------------------------------------------------- seed accessors

    @property
    def batch_generator(self) -> Any:
        """The live mlx-lm ``BatchGenerator`` (``None`` before the first step)."""
        return self.runner.generator if self.runner is not None else None

    def has_requests(self) -> bool:
        return bool(self.waiting or self.running or self._pending_outputs)

    def get_num_waiting(self) -> int:
        return len(self.waiting)

    def get_num_running(self) -> int:
        return len(self.running)

    def get_request(self, request_id: str) -> Request | None:
        return self.requests.get(request_id)

    @property
    def ssd_wait(self) -> Any:
        """The SSD wait policy (``max_wait_s``) while a cache is active, else ``None``."""
        return self._lifecycle.ssd_wait

    def remove_finished_request(self, request_id: str) -> Request | None:
        """Forget a request; only finished ones can be forgotten (a live one stays tracked)."""
        request = self.requests.get(request_id)
        if request is not None and request.is_finished():
            return self.requests.pop(request_id)
        return None

    # ----------------------------------------------------------------- admission

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
            self._fail(request, str(exc))
            return
        self.waiting.push(request)

    def _ensure_runner(self) -> BatchRunner:
        if self.runner is None:
            self.runner = self._runner_factory(self.model, self.config)
        return self.runner

    def _admits_this_step(self) -> bool:
        """Whether this step hands the generator new prompts: not when it returns first tokens
        and holding admission for one decode step gains them more than it costs the queue
        (:mod:`engine_worker.sched.pacer`)."""
        if not self.running:
            return True
        return not self._pacer.hold(due=self._first_tokens_due, waiting=len(self.waiting))

    def _schedule_waiting(self, out: SchedulerOutput) -> None:
        cap = self._guard.cap(self.config.max_running)
        budget = self.config.max_num_batched_tokens
        plan = self._plan() if self._guard.bounds_kv else None
        # The generator prefills at most prefill_batch_size prompts at once and queues the rest
        # inside, in arrival order. Handing it only what it can start keeps the others here, where
        # the policy orders them, an abort is a queue removal, and a burst's later prompts do not
        # make every step an admission step.
        free = self.config.prefill_batch_size - len(self._prefilling)
        if len(self.running) >= cap and free > 0 and self._give_way(free) and plan is not None:
            plan = self._plan()
        deferred: list[tuple[tuple, Request]] = []  # waiting for an SSD read or a shared prefill
        while self.waiting and len(self.running) < cap and free > 0:
            request = self.waiting.peek()
            if request.remaining_tokens is None:
                if self._lifecycle.holds(request):  # it follows a prefill in progress
                    deferred.append(self.waiting.pop_entry())
                    continue
                self._cache.lookup(request)
                if self._lifecycle.defer(request):
                    deferred.append(self.waiting.pop_entry())
                    continue
            n = len(request.remaining_tokens)
            # The first request of a step is admitted even above the budget, or a prompt longer
            # than the budget would wait forever.
            if out.scheduled_request_ids and out.num_scheduled_tokens + n > budget:
                break
            if plan is not None and not plan.admit(sequence_tokens(request), n):
                if self.running or out.scheduled_request_ids:
                    break  # it waits until finishing requests give their memory back
                self.waiting.pop()
                self._fail(request, str(self._too_big(plan, request, n)))
                continue
            self.waiting.pop()
            if self._insert(request):
                out.scheduled_request_ids.append(request.request_id)
                out.num_scheduled_tokens += n
                free -= 1
        for entry in deferred:
            self.waiting.restore(entry)

    def _insert(self, request: Request) -> bool:
        sp = request.sampling_params
        tokens = request.prompt_token_ids
        cache = request.prompt_cache
        # A preempted request resumes: its prompt and output so far are its new prompt.
        resumed = request.status == RequestStatus.PREEMPTED
        runner = self._ensure_runner()
        insert = runner.insert_urgent if self._urgent(request) else runner.insert
        try:
            uid = insert(
                request.remaining_tokens,
                max_tokens=sp.max_tokens - request.num_output_tokens,
                cache=cache,
                all_tokens=tokens[: request.cached_tokens] if cache is not None else None,
                sampler=self._sampling.sampler(sp),
                logits_processors=self._sampling.logits_processors(sp, self._processor_guard(request)),
                stop_sequences=self._sampling.stop_sequences(sp),
            )
        except (ValueError, TypeError) as exc:
            # The generator validates inserts before touching its state, so nothing else is hit.
            logger.warning("request %s could not be inserted: %s", request.request_id, exc)
            self._fail(request, f"could not start generation: {exc}")
            return False
        rid = request.request_id
        request.prompt_cache = None  # the generator merged (copied) it
        request.batch_uid = uid
        self._prefilling.add(uid)
        request.status = RequestStatus.RUNNING
        self.request_id_to_uid[rid] = uid
        self.uid_to_request_id[uid] = rid
        self.running[rid] = request
        stream = self._streams.get(rid) if resumed else None  # a resumed request's text goes on
        if stream is None:
            stream = self._streams[rid] = TextStream(self._new_detokenizer(), sp.stop)
        self._live_by_uid[uid] = (request, stream)
        if sp.logprobs is not None:
            self._logprobs_by_uid[uid] = sp.logprobs
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
        outputs = self._pending_outputs
        self._pending_outputs = []
        if self.waiting and self._admits_this_step():
            self._schedule_waiting(out)
            outputs.extend(self._pending_outputs)  # requests that failed to insert
            self._pending_outputs = []
        if self.running and self._guard.bounds_kv:
            self._fit_batch()
            outputs.extend(self._pending_outputs)  # a request alone too big for the budget
            self._pending_outputs = []
        if self.running:
            out.has_work = True
            prompt_work = bool(self._prefilling)  # inserted or prefilling: the step admits or prefills
            started = time.perf_counter()
            try:
                responses, prompts_done = self.runner.step()
            except Exception as exc:
                # The batch's state is unknown after a failed step: drop the generator. Out of
                # device memory, the batch waits again and runs smaller; any other failure fails
                # the requests in it (each gets an error output). The queue keeps being served.
                self.counters.num_step_errors += 1
                if device_memory.is_allocation_failure(exc):
                    self._recover_from_allocation_failure(exc)
                else:
                    logger.exception("generation step failed; failing %d running requests", len(self.running))
                    self._fail_running("generation step failed")
                outputs.extend(self._pending_outputs)
                self._pending_outputs = []
                responses = ()
            else:
                self._guard.step_succeeded(self.config.max_running)
                self._pacer.record(time.perf_counter() - started, prompt_work=prompt_work)
                self._first_tokens_due = len(prompts_done)
                self._prefilling.difference_update(prompts_done)
                self._lifecycle.after_step(self.runner)  # mid-prefill saves; no-op for short prompts
            if self._processor_errors:
                self._fail_processor_errors()
                outputs.extend(self._pending_outputs)
                self._pending_outputs = []
            if responses:
                self.counters.total_generated_tokens += len(responses)
                self._process_responses(responses, outputs)
        self.counters.num_steps += 1
        out.outputs = outputs
        finished = out.finished_request_ids
        for o in outputs:
            if o.finished:
                finished.add(o.request_id)
        self.finished_req_ids = finished
        return out

    def _process_responses(self, responses: Any, outputs: list[RequestOutput]) -> None:
        # The per-token hot path: one dict lookup per response, no per-step rebuilds, nothing
        # O(output length): tokens and text are appended, and step_output snapshots them in O(1).
        now = time.time()
        live = self._live_by_uid
        append = outputs.append
        wants = self._logprobs_by_uid
        asking: list[tuple[RequestOutput, tuple[Any, int, int]]] = []  # outputs that want log probabilities
        for r in responses:
            entry = live.get(r.uid)
            if entry is None:  # removed earlier in this step
                continue
            request, stream = entry
            k = wants.get(r.uid) if wants else None  # before _finish releases the uid
            if request.first_token_time is None:
                request.first_token_time = now
            reason = r.finish_reason
            tokens = request.output_token_ids
            if reason == "stop":
                # The token is the stop token itself: it is neither text nor output.
                new_ids: list[int] = []
                text = stream.finish()
            else:
                token = r.token
                tokens.append(token)
                new_ids = [token]
                text = stream.add(token)
                if stream.stopped:
                    reason = "stop"
                    self._remove_from_batch(request, stop_string=True)
                elif reason == "length":
                    text += stream.finish()
            if text:
                request.append_output_text(text)
            if reason is not None:
                self._finish(request, reason, r.prompt_cache, r.all_tokens)
            out = step_output(request, new_ids, text, reason)
            if k is not None:
                out.new_logprobs = []
                if new_ids:
                    asking.append((out, (r.logprobs, new_ids[0], k)))
            append(out)
        if asking:
            for (out, _), entry in zip(asking, token_logprobs([row for _, row in asking]), strict=True):
                out.new_logprobs = [entry]
