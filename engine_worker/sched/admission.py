"""Admission: the checks a request passes before it may wait (:class:`RequestValidator`), and which
waiting requests join the batch at a step (:class:`Admission`).

A step admits within its budgets: the batch's cap (``max_num_seqs`` and the generator's capacity,
lowered after an allocation failure), the generator's free prefill slots, ``max_num_batched_tokens``
of prompt tokens, the worker's memory budget, in the policy's order. Under ``PRIORITY`` a full
batch first gives way to more urgent waiting requests. A request that follows a prefill in
progress, or waits for its SSD entry, stays in the queue for a later step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine_worker.cache.hooks import CacheLifecycle
from engine_worker.cache.seam import PrefixSeam
from engine_worker.common.config import SchedulerConfig
from engine_worker.common.errors import InvalidRequest, PromptTooLong, TokenizationError, UnsupportedInput
from engine_worker.common.request import Request
from engine_worker.runner.logprobs import MAX_TOP_LOGPROBS
from engine_worker.sched.batch import Batch, sequence_tokens
from engine_worker.sched.exits import Exits
from engine_worker.sched.memory import MemoryGuard
from engine_worker.sched.preemption import Preemptor
from engine_worker.sched.waiting_queue import WaitingQueue


class RequestValidator:
    """Turns a request's prompt into token ids and refuses what cannot run.

    Every refusal is a :class:`~engine_worker.common.errors.RequestError` naming the request; the
    scheduler finishes that request alone with ``finish_reason="error"``.
    """

    def __init__(self, tokenizer: Any, max_model_len: int | None, vocab_size: int | None) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size

    def prepare(self, request: Request) -> None:
        """Set ``prompt_token_ids`` and ``num_prompt_tokens``, or raise a ``RequestError``."""
        rid = request.request_id
        multimodal = request.multimodal_input()
        if multimodal is not None:
            raise UnsupportedInput(multimodal, request_id=rid)
        sp = request.sampling_params
        if sp.max_tokens <= 0:
            raise InvalidRequest(f"max_tokens must be > 0, got {sp.max_tokens}", request_id=rid)
        if sp.temperature < 0:
            raise InvalidRequest("temperature must be >= 0", request_id=rid)
        if sp.logprobs is not None and not 0 <= sp.logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {sp.logprobs}", request_id=rid)
        if request.prompt_token_ids is None:
            request.prompt_token_ids = self._tokenize(request)
        tokens = request.prompt_token_ids
        request.num_prompt_tokens = len(tokens)
        if not tokens:
            raise InvalidRequest("the prompt is empty", request_id=rid)
        if self.max_model_len is not None and len(tokens) > self.max_model_len:
            raise PromptTooLong(limit=self.max_model_len, length=len(tokens), request_id=rid)
        vocab = self.vocab_size
        if vocab is not None and not all(0 <= t < vocab for t in tokens):
            raise InvalidRequest(f"prompt token ids must be in [0, {vocab})", request_id=rid)

    def _tokenize(self, request: Request) -> list[int]:
        prompt = request.prompt
        if not isinstance(prompt, str):
            return [int(t) for t in prompt]
        # A multimodal processor keeps its text tokenizer in ``.tokenizer`` (seed S23).
        encode = getattr(self.tokenizer, "encode", None) or self.tokenizer.tokenizer.encode
        try:
            return list(encode(prompt))
        # A tokenizer is third-party code: whatever it raises concerns this one prompt only.
        except Exception as exc:
            raise TokenizationError(f"tokenizer failed: {exc}", request_id=request.request_id) from exc


class Admission:
    """Which waiting requests of one scheduler join its batch at a step."""

    def __init__(self, config: SchedulerConfig, waiting: WaitingQueue, batch: Batch, guard: MemoryGuard,
                 preemptor: Preemptor, cache: PrefixSeam, lifecycle: CacheLifecycle, exits: Exits) -> None:
        self._config = config
        self._waiting = waiting
        self._batch = batch
        self._guard = guard
        self._preemptor = preemptor
        self._cache = cache
        self._lifecycle = lifecycle
        self._exits = exits

    def admit(self, insert: Callable[[Request], bool]) -> tuple[list[str], int]:
        """Take waiting requests into the batch, each through ``insert`` (False: it failed and
        ended); returns the ids admitted and their prompt tokens still to prefill."""
        batch, waiting, guard = self._batch, self._waiting, self._guard
        cap = guard.cap(self._config.max_running)
        budget = self._config.max_num_batched_tokens
        plan = batch.plan(guard) if guard.bounds_kv else None
        # The generator prefills at most prefill_batch_size prompts at once and queues the rest
        # inside, in arrival order. Handing it only what it can start keeps the others here, where
        # the policy orders them, an abort is a queue removal, and a burst's later prompts do not
        # make every step an admission step.
        free = self._config.prefill_batch_size - len(batch.prefilling)
        if len(batch.running) >= cap and free > 0 and self._preemptor.give_way(free) and plan is not None:
            plan = batch.plan(guard)
        admitted: list[str] = []
        tokens = 0
        deferred: list[tuple[tuple, Request]] = []  # waiting for an SSD read or a shared prefill
        while waiting and len(batch.running) < cap and free > 0:
            request = waiting.peek()
            if request.remaining_tokens is None:
                if self._lifecycle.holds(request):  # it follows a prefill in progress
                    deferred.append(waiting.pop_entry())
                    continue
                self._cache.lookup(request)
                if self._lifecycle.defer(request):
                    deferred.append(waiting.pop_entry())
                    continue
            n = len(request.remaining_tokens or ())  # set by the lookup above
            # The first request of a step is admitted even above the budget, or a prompt longer
            # than the budget would wait forever.
            if admitted and tokens + n > budget:
                break
            if plan is not None and not plan.admit(sequence_tokens(request), n):
                if batch.running or admitted:
                    break  # it waits until finishing requests give their memory back
                waiting.pop()
                self._exits.fail(request, str(self._preemptor.too_big(plan, request, n)))
                continue
            waiting.pop()
            if insert(request):
                admitted.append(request.request_id)
                tokens += n
                free -= 1
        for entry in deferred:
            waiting.restore(entry)
        return admitted, tokens
