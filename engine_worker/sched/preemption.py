"""Preemption: running requests go back to wait, for memory or for more urgent ones.

* **Memory** (the decisions are :mod:`engine_worker.sched.memory`'s): before each generator step
  the batch, as it grows this step, must fit the worker's budget; the least urgent requests wait
  again until it does (a request that does not fit alone fails), and the prefix cache gets what
  the batch leaves. A step that ran out of device memory is survived: the batch waits again and
  the next ones run at most half as large.
* **Priority**: under ``PRIORITY`` a full batch gives way to more urgent waiting requests.

A preempted request keeps its output so far and re-prefills its prompt and that output when it
runs again (mlx-lm's generator cannot hand a sequence's state back without a copy, which is the
memory it ran short of).
"""

from __future__ import annotations

import itertools
import logging

from engine_worker.cache.seam import PrefixSeam
from engine_worker.common.config import SchedulerConfig, SchedulingPolicy
from engine_worker.common.errors import ExceedsMemoryBudget
from engine_worker.common.request import Request, RequestStatus
from engine_worker.runner import device_memory
from engine_worker.sched.batch import Batch, sequence_tokens
from engine_worker.sched.exits import Exits
from engine_worker.sched.memory import BatchPlan, MemoryGuard
from engine_worker.sched.stats import SchedulerCounters
from engine_worker.sched.waiting_queue import WaitingQueue

logger = logging.getLogger(__name__)


class Preemptor:
    """Takes requests of one scheduler's batch back to its waiting queue."""

    def __init__(self, config: SchedulerConfig, batch: Batch, waiting: WaitingQueue, guard: MemoryGuard,
                 cache: PrefixSeam, exits: Exits, counters: SchedulerCounters) -> None:
        self._config = config
        self._batch = batch
        self._waiting = waiting
        self._guard = guard
        self._cache = cache
        self._exits = exits
        self._counters = counters

    def urgency(self, request: Request) -> tuple[float, ...]:
        """Sort key, most urgent first: arrival (with ``PRIORITY``, priority then arrival)."""
        if self._config.policy is SchedulingPolicy.PRIORITY:
            return (request.priority, request.arrival_time)
        return (request.arrival_time,)

    def too_big(self, plan: BatchPlan, request: Request, prefill_tokens: int) -> ExceedsMemoryBudget:
        """The error of a request that does not fit the budget even alone beside ``plan``."""
        budget = self._guard.budget
        need = budget.need(plan.shape((sequence_tokens(request), prefill_tokens)))
        return ExceedsMemoryBudget(need=need, budget=budget.total, request_id=request.request_id)

    def fit_batch(self) -> None:
        """Before a generator step: preempt the least urgent requests until the batch, as it grows
        this step, fits the memory budget (a request that does not fit alone fails), and give the
        prefix cache what the batch leaves."""
        guard = self._guard
        plan = self._batch.plan(guard)
        headroom = guard.headroom(plan)
        if headroom < 0:
            keep = max(1, guard.rows_that_fit(plan))
            by_urgency = sorted(self._batch.running.values(), key=self.urgency)
            if keep < len(by_urgency):
                self.preempt(by_urgency[keep:])
                plan = self._batch.plan(guard)
                headroom = guard.headroom(plan)
            if headroom < 0:
                request = by_urgency[0]
                error = self.too_big(plan, request, 0)
                self._exits.remove_from_batch(request)
                self._exits.fail(request, str(error))
                return
        self._cache.set_byte_limit(min(headroom, guard.budget.prefix_cache))

    def give_way(self, slots: int) -> bool:
        """With ``PRIORITY``, a full batch gives way to more urgent waiting requests: each of the
        first ``slots`` waiting requests whose priority is more urgent (lower) than that of the
        least urgent decoding request takes its place; those wait again (:meth:`requeue`), ahead
        of the less urgent ones still waiting. Equal priorities never preempt each other, and a
        request still prefilling is not taken out. Returns whether any request was taken out."""
        if self._config.policy is not SchedulingPolicy.PRIORITY or not self._waiting:
            return False
        decoding = self._batch.decoding()
        # The usual full batch: nothing waiting is more urgent than everything running.
        if not decoding or self._waiting.peek().priority >= max(r.priority for r in decoding):
            return False
        decoding.sort(key=self.urgency, reverse=True)  # least urgent first
        victims: list[Request] = []
        for request in itertools.islice(self._waiting, slots):
            if len(victims) == len(decoding) or request.priority >= decoding[len(victims)].priority:
                break
            victims.append(decoding[len(victims)])
        self.preempt(victims, reason="for more urgent waiting requests")
        return True

    def preempt(self, requests: list[Request], reason: str = "to stay within the memory budget") -> None:
        """Take running requests out of the batch, in one removal (each removal copies the
        batch's KV), and queue them again at the head."""
        self._batch.remove(requests)
        for request in reversed(requests):  # the most urgent ends at the head
            self.requeue(request)
        logger.info("preempted %d requests %s", len(requests), reason)

    def requeue(self, request: Request) -> None:
        """Queue a request taken out of the batch again, at the head: it keeps its output so far,
        and re-prefills its prompt and that output when it runs again.

        A greedy request goes on with the tokens it would have produced; a sampled one draws on
        from where it is (a seeded one's draws restart from its seed, so it is not reproducible
        across a preemption), and a multi-token stop sequence split by the preemption is missed.
        """
        self._exits.unmap(request.request_id)
        request.status = RequestStatus.PREEMPTED
        request.batch_uid = None
        request.prompt_cache = None
        request.remaining_tokens = [*request.prompt_ids, *request.output_token_ids]
        self._waiting.push_front(request)
        self._counters.num_preemptions += 1

    def recover_from_allocation_failure(self, exc: BaseException) -> None:
        """A step failed on the device (out of memory, or another failure of its evaluation, which
        mlx reports with the same exception type: :func:`device_memory.is_allocation_failure`). The
        generator's state is unknown, so it is dropped; the allocator's cache and half the prefix
        cache are freed; the batch waits again, ahead of the queue, and the next ones run at most
        half as large. A batch of one request cannot shrink: that request fails alone."""
        running = sorted(self._batch.running.values(), key=lambda r: r.arrival_time, reverse=True)
        logger.warning("a step of %d requests failed on the device (%r); running at most %d at once",
                       len(running), exc, max(1, len(running) // 2))
        self._counters.num_allocation_failures += 1
        self._guard.allocation_failed(len(running))
        if len(running) == 1:
            self._exits.fail(running[0], f"the device failed a step of this request alone: {exc!r}")
        else:
            for request in running:  # latest first: each goes to the head, so the earliest ends first
                self.requeue(request)
        self._batch.drop_runner()
        self._cache.set_byte_limit(self._cache.bytes_used // 2)
        device_memory.clear_allocator_cache()
