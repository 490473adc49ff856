"""The scheduler's memory side: keeping the batch within the worker's budget, preempting, and
surviving a step that ran out of device memory (the decisions are :mod:`engine_worker.sched.memory`'s).

A mixin of :class:`engine_worker.sched.scheduler.Scheduler`, kept apart so the step function's file
stays readable; it works on the scheduler's own state, named below.
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Any

from engine_worker.cache.seam import PrefixSeam
from engine_worker.common.config import SchedulerConfig, SchedulingPolicy
from engine_worker.common.errors import ExceedsMemoryBudget
from engine_worker.common.request import Request, RequestStatus
from engine_worker.runner import device_memory
from engine_worker.sched.memory import BatchPlan, MemoryBudget, MemoryGuard
from engine_worker.sched.stats import SchedulerCounters
from engine_worker.sched.waiting_queue import WaitingQueue

logger = logging.getLogger(__name__)


class BatchMemory:
    """Budget checks, preemption and allocation-failure recovery for the scheduler's batch."""

    config: SchedulerConfig
    memory_budget: MemoryBudget
    running: dict[str, Request]
    waiting: WaitingQueue
    counters: SchedulerCounters
    runner: Any
    _guard: MemoryGuard
    _cache: PrefixSeam
    _prefilling: set[int]
    _live_by_uid: dict[int, Any]
    request_id_to_uid: dict[str, int]

    if TYPE_CHECKING:  # provided by engine_worker.sched.exits.BatchExits
        def _remove_from_batch(self, request: Request, *, stop_string: bool = False) -> None: ...
        def _fail(self, request: Request, message: str) -> None: ...
        def _unmap(self, rid: str) -> None: ...
        def _drop_runner(self) -> None: ...

    def _plan(self) -> BatchPlan:
        """The running batch as the memory guard sees it: the generator's KV bytes, its rows and
        its prefilling rows (whose KV may not exist yet). A runner that cannot tell its KV bytes
        (a scripted one) has its rows counted as long as its longest sequence."""
        prefills = []
        for uid in self._prefilling:
            entry = self._live_by_uid.get(uid)
            if entry is not None:
                request = entry[0]
                prefills.append((sequence_tokens(request), len(request.remaining_tokens or ())))
        kv_bytes = self.runner.kv_bytes() if self.runner is not None else None
        if kv_bytes is not None:
            return self._guard.plan(kv_bytes, len(self.running), 0, prefills)
        longest = max((sequence_tokens(r) for r in self.running.values()), default=0)
        return self._guard.plan(0, len(self.running), longest, prefills)

    def _too_big(self, plan: BatchPlan, request: Request, prefill_tokens: int) -> ExceedsMemoryBudget:
        budget = self.memory_budget
        need = budget.need(plan.shape((sequence_tokens(request), prefill_tokens)))
        return ExceedsMemoryBudget(need=need, budget=budget.total, request_id=request.request_id)

    def _fit_batch(self) -> None:
        """Before a generator step: preempt the least urgent requests until the batch, as it grows
        this step, fits the memory budget (a request that does not fit alone fails), and give the
        prefix cache what the batch leaves."""
        plan = self._plan()
        headroom = self._guard.headroom(plan)
        if headroom < 0:
            keep = max(1, self._guard.rows_that_fit(plan))
            by_urgency = sorted(self.running.values(), key=self._urgency)
            if keep < len(by_urgency):
                self._preempt(by_urgency[keep:])
                plan = self._plan()
                headroom = self._guard.headroom(plan)
            if headroom < 0:
                request = by_urgency[0]
                error = self._too_big(plan, request, 0)
                self._remove_from_batch(request)
                self._fail(request, str(error))
                return
        self._cache.set_byte_limit(min(headroom, self.memory_budget.prefix_cache))

    def _urgency(self, request: Request) -> tuple[float, ...]:
        """Sort key, most urgent first: arrival (with ``PRIORITY``, priority then arrival)."""
        if self.config.policy is SchedulingPolicy.PRIORITY:
            return (request.priority, request.arrival_time)
        return (request.arrival_time,)

    def _preempt(self, requests: list[Request], reason: str = "to stay within the memory budget") -> None:
        """Take running requests out of the batch, in one removal (each removal copies the
        batch's KV), and queue them again at the head."""
        uids = [self.request_id_to_uid[r.request_id] for r in requests if r.request_id in self.request_id_to_uid]
        if uids and self.runner is not None:
            self.runner.remove(uids)
        for request in reversed(requests):  # the most urgent ends at the head
            self._requeue(request)
        logger.info("preempted %d requests %s", len(requests), reason)

    def _give_way(self, slots: int) -> bool:
        """With ``PRIORITY``, a full batch gives way to more urgent waiting requests: each of the
        first ``slots`` waiting requests whose priority is more urgent (lower) than that of the
        least urgent decoding request takes its place; those wait again (:meth:`_requeue`), ahead
        of the less urgent ones still waiting. Equal priorities never preempt each other, and a
        request still prefilling is not taken out. Returns whether any request was taken out."""
        if self.config.policy is not SchedulingPolicy.PRIORITY or not self.waiting:
            return False
        decoding = [r for r in self.running.values() if r.batch_uid not in self._prefilling]
        # The usual full batch: nothing waiting is more urgent than everything running.
        if not decoding or self.waiting.peek().priority >= max(r.priority for r in decoding):
            return False
        decoding.sort(key=self._urgency, reverse=True)  # least urgent first
        victims: list[Request] = []
        for request in itertools.islice(self.waiting, slots):
            if len(victims) == len(decoding) or request.priority >= decoding[len(victims)].priority:
                break
            victims.append(decoding[len(victims)])
        self._preempt(victims, reason="for more urgent waiting requests")
        return True

    def _requeue(self, request: Request) -> None:
        """Queue a request taken out of the batch again, at the head: it keeps its output so far,
        and re-prefills its prompt and that output when it runs again (mlx-lm's generator cannot
        hand a sequence's state back without a copy, which is the memory it ran short of).

        A greedy request goes on with the tokens it would have produced; a sampled one draws on
        from where it is (a seeded one's draws restart from its seed, so it is not reproducible
        across a preemption), and a multi-token stop sequence split by the preemption is missed.
        """
        self._unmap(request.request_id)
        request.status = RequestStatus.PREEMPTED
        request.batch_uid = None
        request.prompt_cache = None
        request.remaining_tokens = [*request.prompt_token_ids, *request.output_token_ids]
        self.waiting.push_front(request)
        self.counters.num_preemptions += 1

    def _recover_from_allocation_failure(self, exc: BaseException) -> None:
        """A step failed on the device (out of memory, or another failure of its evaluation, which
        mlx reports with the same exception type: device_memory.is_allocation_failure). The generator's state is unknown, so it is
        dropped; the allocator's cache and half the prefix cache are freed; the batch waits again,
        ahead of the queue, and the next ones run at most half as large. A batch of one request
        cannot shrink: that request fails alone."""
        running = sorted(self.running.values(), key=lambda r: r.arrival_time, reverse=True)
        logger.warning("a step of %d requests failed on the device (%r); running at most %d at once",
                       len(running), exc, max(1, len(running) // 2))
        self.counters.num_allocation_failures += 1
        self._guard.allocation_failed(len(running))
        if len(running) == 1:
            self._fail(running[0], f"the device failed a step of this request alone: {exc!r}")
        else:
            for request in running:  # latest first: each goes to the head, so the earliest ends first
                self._requeue(request)
        self._drop_runner()
        self._cache.set_byte_limit(self._cache.bytes_used // 2)
        device_memory.clear_allocator_cache()

    def _memory_use(self) -> dict[str, int]:
        """The budget and its parts now: weights, the batch's KV, the prefix cache (the allocator
        cache is ``cache_bytes``), with the limits of the last two."""
        budget = self.memory_budget
        kv_bytes = self.runner.kv_bytes() if self.runner is not None else None
        return {
            "budget_bytes": budget.total,
            "weights_bytes": budget.weights,
            "kv_bytes": kv_bytes or 0,
            "prefix_cache_bytes": self._cache.bytes_used,
            "prefix_cache_limit_bytes": budget.prefix_cache if self._cache.active else 0,
            "cache_limit_bytes": budget.allocator_cache,
        }


def sequence_tokens(request: Request) -> int:
    """The tokens a request's KV holds once its prompt is processed: a resumed request's output
    so far is part of its prompt."""
    return request.num_prompt_tokens + request.num_output_tokens
