"""The scheduler's queue of requests waiting for admission into the batch."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator

from engine_worker.common.config import SchedulingPolicy
from engine_worker.common.request import Request


class WaitingQueue:
    """Requests in admission order: arrival (FCFS), or priority then arrival (PRIORITY).

    Kept as a sorted list: pushes are a binary search plus a memmove, which stays far below a
    model step for the few thousand waiting requests a worker can hold, and removal of an aborted
    request is direct (the seed's deque lost aborted waiters, defect 8).
    """

    def __init__(self, policy: SchedulingPolicy = SchedulingPolicy.FCFS) -> None:
        self._policy = policy
        self._items: list[tuple[tuple, Request]] = []
        self._seq = itertools.count()
        self._front = itertools.count(-1, -1)  # keys of push_front, each ahead of all before it

    def _key(self, request: Request) -> tuple:
        # The sequence number breaks ties (equal arrival times) in push order.
        if self._policy is SchedulingPolicy.PRIORITY:
            return (request.priority, request.arrival_time, next(self._seq))
        return (next(self._seq),)

    def push(self, request: Request) -> None:
        key = self._key(request)
        bisect.insort(self._items, (key, request), key=lambda item: item[0])

    def push_front(self, request: Request) -> None:
        """Queue a request taken back out of the batch: under FCFS ahead of every other; under
        PRIORITY in its place by priority and arrival, which is ahead of later arrivals."""
        if self._policy is SchedulingPolicy.PRIORITY:
            self.push(request)
            return
        self._items.insert(0, ((next(self._front),), request))

    def peek(self) -> Request:
        return self._items[0][1]

    def pop(self) -> Request:
        return self._items.pop(0)[1]

    def pop_entry(self) -> tuple[tuple, Request]:
        """Pop the head with its queue key, for :meth:`restore`."""
        return self._items.pop(0)

    def restore(self, entry: tuple[tuple, Request]) -> None:
        """Put back an entry taken with :meth:`pop_entry`: it keeps its place in the order (a
        request deferred for a step does not fall behind later arrivals)."""
        bisect.insort(self._items, entry, key=lambda item: item[0])

    def remove(self, request: Request) -> bool:
        for i, (_, queued) in enumerate(self._items):
            if queued is request:
                del self._items[i]
                return True
        return False

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[Request]:
        return iter([request for _, request in self._items])
