"""Under the PRIORITY policy a request more urgent than the batch's least urgent starts in the urgent
lane: its first token comes out while the batch waits, and every request keeps its greedy tokens
(the real tiny model)."""

from __future__ import annotations

import pytest

from engine_worker.common.config import SchedulerConfig, SchedulingPolicy
from engine_worker.common.request import Request
from engine_worker.runner.urgent_lane import MAX_STEPS_ALONE, in_lane
from engine_worker.sched.scheduler import Scheduler
from tests.engine_worker.engine_helpers import final, greedy, prompt_ids, run_scheduler, solo_tokens

ARRIVAL = 6  # both low requests decode by then


def _scheduler(model, tokenizer, policy=SchedulingPolicy.PRIORITY, **config) -> Scheduler:
    config = {"completion_batch_size": 8, "prefill_batch_size": 4, **config}
    return Scheduler(model, tokenizer, SchedulerConfig(policy=policy, **config))


def _low(tokenizer, n: int = 2, max_tokens: int = 30) -> list[Request]:
    return [Request(f"low{i}", prompt_ids(tokenizer, 12 + i), greedy(max_tokens), priority=100) for i in range(n)]


def _urgent(tokenizer, name: str = "urgent", max_tokens: int = 4, n: int = 14) -> Request:
    return Request(name, prompt_ids(tokenizer, n, seed_text="now()\n"), greedy(max_tokens), priority=0)


def _run(scheduler: Scheduler, arrivals: dict[int, list[Request]]) -> tuple[dict, dict[int, set[str]]]:
    """Outputs per request (each tagged with its step), and per step the requests given a token."""
    tokens_in: dict[int, set[str]] = {}

    def on_step(k, result):
        for out in result.outputs:
            out.step = k
            if out.new_token_ids:
                tokens_in.setdefault(k, set()).add(out.request_id)

    return run_scheduler(scheduler, arrivals, on_step=on_step), tokens_in


def _record_inserts(scheduler: Scheduler) -> dict[str, tuple[int, bool]]:
    """Per request started: its cached prompt tokens, and whether it went to the lane."""
    starts: dict[str, tuple[int, bool]] = {}
    insert = scheduler._insert

    def spy(request):
        ok = insert(request)
        starts[request.request_id] = (request.cached_tokens, in_lane(request.batch_uid))
        return ok

    scheduler._insert = spy
    return starts


def _first_token_step(outputs: dict, rid: str) -> int:
    return next(o.step for o in outputs[rid] if o.new_token_ids)


def _assert_solo_tokens(model, tokenizer, outputs: dict, requests: list[Request]) -> None:
    for request in requests:
        done = final(outputs[request.request_id])
        assert done.output_token_ids == solo_tokens(model, tokenizer, request.prompt_token_ids,
                                                    request.sampling_params.max_tokens), request.request_id


def test_an_urgent_request_gets_its_first_token_while_the_batch_waits(tiny_model):
    model, tokenizer = tiny_model
    scheduler = _scheduler(model, tokenizer)
    low, urgent = _low(tokenizer), _urgent(tokenizer)
    starts = _record_inserts(scheduler)

    outputs, tokens_in = _run(scheduler, {0: low, ARRIVAL: [urgent]})

    assert starts["urgent"][1] and not starts["low0"][1]
    first = _first_token_step(outputs, "urgent")
    assert first == ARRIVAL + 2  # the third step that ran it, as when idle
    for step in range(ARRIVAL, first + 1):  # the batch stood still until then
        assert not tokens_in.get(step, set()) & {"low0", "low1"}, step
    assert {"low0", "low1", "urgent"} <= tokens_in[first + 1]  # then both generators step
    assert scheduler.counters.num_preemptions == 0
    _assert_solo_tokens(model, tokenizer, outputs, [*low, urgent])


def test_the_lane_takes_a_request_more_urgent_than_the_batchs_least_urgent(tiny_model):
    model, tokenizer = tiny_model
    scheduler = _scheduler(model, tokenizer)
    peer, urgent = _urgent(tokenizer, "peer", max_tokens=30), _urgent(tokenizer)
    peer.priority = urgent.priority = 10  # the batch holds one as urgent as the newcomer, and a low one
    low = _low(tokenizer, n=1)
    starts = _record_inserts(scheduler)

    outputs, _ = _run(scheduler, {0: [peer, *low], ARRIVAL: [urgent]})

    assert starts["peer"] == (0, False) and starts["urgent"][1]
    _assert_solo_tokens(model, tokenizer, outputs, [peer, *low, urgent])


def test_under_fcfs_or_at_equal_priority_nothing_goes_to_the_lane(tiny_model):
    model, tokenizer = tiny_model
    for policy, priority in ((SchedulingPolicy.FCFS, 0), (SchedulingPolicy.PRIORITY, 100)):
        scheduler = _scheduler(model, tokenizer, policy=policy)
        urgent = _urgent(tokenizer)
        urgent.priority = priority

        outputs, tokens_in = _run(scheduler, {0: _low(tokenizer), ARRIVAL: [urgent]})

        assert scheduler.runner is None or scheduler.runner.lane is None
        # In the batch's generator the first token waits out three batch steps, each decoding low.
        first = _first_token_step(outputs, "urgent")
        assert all({"low0", "low1"} <= tokens_in[step] for step in range(ARRIVAL, first + 1))


def test_a_stream_of_urgent_requests_cannot_stall_the_batch(tiny_model):
    model, tokenizer = tiny_model
    scheduler = _scheduler(model, tokenizer, completion_batch_size=16, prefill_batch_size=8)
    low = _low(tokenizer, max_tokens=24)
    stream = {ARRIVAL + k: [_urgent(tokenizer, f"urgent{k}", max_tokens=2)] for k in range(12)}

    outputs, tokens_in = _run(scheduler, {0: low, **stream})

    low_steps = sorted(k for k, rids in tokens_in.items() if "low0" in rids)
    gaps = [b - a for a, b in zip(low_steps, low_steps[1:], strict=False)]
    assert max(gaps) == MAX_STEPS_ALONE + 1  # it stood still, and never longer than that
    _assert_solo_tokens(model, tokenizer, outputs, [*low, *(r for rs in stream.values() for r in rs)])


def test_an_aborted_lane_request_leaves_and_the_batch_goes_on(tiny_model):
    model, tokenizer = tiny_model
    scheduler = _scheduler(model, tokenizer)
    low, urgent = _low(tokenizer), _urgent(tokenizer, max_tokens=20)
    aborted = []

    def on_step(k, result):
        if k == ARRIVAL + 4:
            assert in_lane(scheduler.running["urgent"].batch_uid)
            scheduler.abort_request("urgent")
            aborted.append(k)

    outputs = run_scheduler(scheduler, {0: low, ARRIVAL: [urgent]}, on_step=on_step)

    assert aborted and final(outputs["urgent"]).finish_reason == "abort"
    assert len(final(outputs["urgent"]).output_token_ids) < 20
    assert not scheduler.runner._lane_uids
    _assert_solo_tokens(model, tokenizer, outputs, low)


@pytest.mark.parametrize("again", ["urgent", "low"])
def test_a_lane_request_stores_its_prompt_in_the_prefix_cache(tiny_model, again):
    model, tokenizer = tiny_model
    scheduler = _scheduler(model, tokenizer)
    urgent = _urgent(tokenizer, n=40)  # longer than an index block: the cache stores it
    repeat = _urgent(tokenizer, "repeat", n=40)
    repeat.priority = 0 if again == "urgent" else 100
    starts = _record_inserts(scheduler)

    outputs, _ = _run(scheduler, {0: _low(tokenizer), ARRIVAL: [urgent], ARRIVAL + 12: [repeat]})

    assert starts["urgent"] == (0, True)
    cached, lane = starts["repeat"]
    assert lane is (again == "urgent") and cached >= len(repeat.prompt_token_ids) - 1
    assert final(outputs["repeat"]).output_token_ids == final(outputs["urgent"]).output_token_ids
