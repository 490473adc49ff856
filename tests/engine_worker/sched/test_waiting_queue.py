"""The waiting queue's order, including requests put back after a deferred step."""

from __future__ import annotations

from engine_worker.common.config import SchedulingPolicy
from engine_worker.common.request import Request
from engine_worker.sched.waiting_queue import WaitingQueue


def _req(rid: str, *, priority: int = 0, arrival: float = 0.0) -> Request:
    return Request(rid, [1, 2, 3], priority=priority, arrival_time=arrival)


def test_fcfs_request_deferred_for_a_step_keeps_its_place_ahead_of_later_arrivals():
    queue = WaitingQueue(SchedulingPolicy.FCFS)
    queue.push(_req("first"))
    queue.push(_req("second"))
    entry = queue.pop_entry()
    queue.push(_req("third"))
    queue.restore(entry)
    assert [r.request_id for r in queue] == ["first", "second", "third"]


def test_priority_queue_orders_by_priority_then_arrival_and_restore_keeps_that_order():
    queue = WaitingQueue(SchedulingPolicy.PRIORITY)
    queue.push(_req("late-urgent", priority=0, arrival=2.0))
    queue.push(_req("early-lax", priority=5, arrival=1.0))
    queue.push(_req("early-urgent", priority=0, arrival=1.0))
    entry = queue.pop_entry()
    assert entry[1].request_id == "early-urgent"
    queue.restore(entry)
    assert [r.request_id for r in queue] == ["early-urgent", "late-urgent", "early-lax"]
