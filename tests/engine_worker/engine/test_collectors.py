"""Output sinks: a slow async consumer gets merged outputs; a sync waiter collects finals."""

from __future__ import annotations

import asyncio

from engine_worker.common.request import RequestOutput
from engine_worker.engine.collectors import AsyncCollector, SyncWaiter


def _out(n: int, finished: bool = False) -> RequestOutput:
    return RequestOutput("r", [n], f"<{n}>", list(range(1, n + 1)), "".join(f"<{i}>" for i in range(1, n + 1)),
                         finished, "length" if finished else None, 3, n)


async def test_outputs_not_yet_taken_are_merged_into_one():
    collector = AsyncCollector(asyncio.get_running_loop())
    for n in (1, 2, 3):
        collector.put(_out(n))
    out = await collector.get()
    assert out.new_token_ids == [1, 2, 3] and out.new_text == "<1><2><3>"
    assert out.output_token_ids == [1, 2, 3] and out.completion_tokens == 3


async def test_consumer_waits_for_stream_interval_tokens_or_the_end():
    collector = AsyncCollector(asyncio.get_running_loop(), stream_interval=3)
    getter = asyncio.create_task(collector.get())
    collector.put(_out(1))
    collector.put(_out(2))
    await asyncio.sleep(0)
    assert not getter.done()
    collector.put(_out(3))
    assert (await getter).new_token_ids == [1, 2, 3]
    collector.put(_out(4, finished=True))
    last = await asyncio.wait_for(collector.get(), 5)
    assert last.finished and last.new_token_ids == [4]


def test_sync_waiter_finishes_when_every_request_has_its_final():
    waiter = SyncWaiter(["a", "b"])
    waiter.put(RequestOutput("a", finished=True, finish_reason="stop"))
    assert not waiter.wait(0)
    waiter.put(RequestOutput("b", new_token_ids=[1]))
    assert not waiter.wait(0)
    waiter.put(RequestOutput("b", finished=True, finish_reason="length"))
    assert waiter.wait(0) and set(waiter.finals) == {"a", "b"}


def test_merged_outputs_keep_one_log_probability_entry_per_token():
    from engine_worker.engine.collectors import merge_outputs
    from engine_worker.runner.logprobs import TokenLogprob

    a = RequestOutput("r", new_token_ids=[1], new_text="a", completion_tokens=1, new_logprobs=[TokenLogprob(1, -1.0)])
    b = RequestOutput("r", new_token_ids=[2], new_text="b", completion_tokens=2, new_logprobs=[TokenLogprob(2, -2.0)])
    plain = [RequestOutput("p", new_token_ids=[1], new_text="a"), RequestOutput("p", new_token_ids=[2], new_text="b")]

    merged = merge_outputs([a, b])

    assert merged.new_token_ids == [1, 2] and [e.token_id for e in merged.new_logprobs] == [1, 2]
    assert merge_outputs(plain).new_logprobs is None


def test_a_log_probability_that_is_not_finite_is_reported_as_the_floor():
    import mlx.core as mx

    from engine_worker.runner.logprobs import FLOOR, token_logprobs

    row = mx.array([0.0, -float("inf"), -1.0, float("nan")])
    (entry,) = token_logprobs([(row, 1, 4)])

    assert entry.logprob == FLOOR
    assert all(lp == FLOOR or lp > FLOOR for _, lp in entry.top) and len(entry.top) == 4
    assert {t for t, lp in entry.top if lp == FLOOR} == {1, 3}
