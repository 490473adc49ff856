"""A trickle of arrivals joins a decoding batch in groups: the scheduler holds a short queue until
its summed wait reaches what one admission step costs the running requests (the scripted runner,
the queue's clock and the pacer's step times fixed)."""

from __future__ import annotations

import pytest

from engine_worker.common.config import SchedulingPolicy
from engine_worker.common.request import Request
from tests.engine_worker.engine_helpers import greedy
from tests.engine_worker.fake_runner import scripted_scheduler
from tests.engine_worker.sched.fixed_pacer import FixedPacer


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("engine_worker.sched.waiting_queue.time.monotonic", lambda: now[0])
    return now


def _decoding(n: int, **config):
    """A scheduler whose batch decodes ``n`` long requests; an admission step costs each 8 ms."""
    scheduler = scripted_scheduler(enable_prefix_cache=False, **config)
    scheduler._pacer = FixedPacer(admit_ms=10, decode_ms=2)
    for i in range(n):
        scheduler.add_request(Request(f"run{i}", [1, 2, 3], greedy(500), priority=5))
    while scheduler.get_num_waiting() or scheduler._batch.prefilling or scheduler._batch.first_tokens_due:
        scheduler.step()
    return scheduler


def test_arrivals_one_by_one_are_admitted_together_once_their_wait_outweighs_an_admission_step(clock):
    scheduler = _decoding(4, prefill_batch_size=8)  # one admission step costs the batch 4 x 8 = 32 ms
    scheduler.add_request(Request("a", [4, 5, 6], greedy(3)))
    assert scheduler.step().scheduled_request_ids == []
    clock[0] += 0.020
    scheduler.add_request(Request("b", [4, 5, 7], greedy(3)))
    assert scheduler.step().scheduled_request_ids == []  # 20 + 0 ms waited in all
    clock[0] += 0.005
    assert scheduler.step().scheduled_request_ids == []  # 25 + 5 = 30 ms < 32
    clock[0] += 0.002
    # 27 + 7 = 34 ms: one admission step for both (before, "a" and "b" each had their own)
    assert scheduler.step().scheduled_request_ids == ["a", "b"]


def test_a_queue_that_fills_an_admission_step_is_admitted_at_once(clock):
    scheduler = _decoding(4, prefill_batch_size=2)
    scheduler.add_request(Request("a", [4, 5, 6], greedy(3)))
    scheduler.add_request(Request("b", [4, 5, 7], greedy(3)))
    assert scheduler.step().scheduled_request_ids == ["a", "b"]


def test_a_long_enough_prompt_is_admitted_at_once(clock):
    scheduler = _decoding(4, prefill_batch_size=8, max_num_batched_tokens=16)
    scheduler.add_request(Request("long", list(range(10, 30)), greedy(3)))
    assert scheduler.step().scheduled_request_ids == ["long"]


def test_with_nothing_running_a_lone_request_is_admitted_at_once(clock):
    scheduler = scripted_scheduler(enable_prefix_cache=False, prefill_batch_size=8)
    scheduler._pacer = FixedPacer(admit_ms=10, decode_ms=2)
    scheduler.add_request(Request("a", [4, 5, 6], greedy(3)))
    assert scheduler.step().scheduled_request_ids == ["a"]


def test_a_request_for_the_urgent_lane_is_never_held(clock):
    scheduler = _decoding(4, prefill_batch_size=8, policy=SchedulingPolicy.PRIORITY)
    scheduler.add_request(Request("urgent", [4, 5, 6], greedy(3), priority=0))
    assert scheduler.step().scheduled_request_ids == ["urgent"]
