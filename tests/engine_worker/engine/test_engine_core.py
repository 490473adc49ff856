"""EngineCore: one engine thread owns mlx; asyncio and synchronous callers share it safely."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from engine_worker.common.config import EngineConfig
from engine_worker.common.errors import DuplicateRequest, EngineClosed
from engine_worker.common.request import Request
from engine_worker.engine_core import AsyncEngineCore, EngineCore
from engine_worker.runner.urgent_lane import LanedRunner
from tests.engine_worker.engine_helpers import greedy, prompt_ids, solo_tokens


@pytest.fixture
def engine(tiny_model):
    model, tokenizer = tiny_model
    engine = EngineCore(model, tokenizer)
    yield engine
    engine.close()


def _slow_processor(seconds: float):
    def processor(_context, logits):
        time.sleep(seconds)
        return logits

    return processor


async def test_generate_returns_the_final_output_equal_to_a_solo_run(engine, tiny_model):
    model, tokenizer = tiny_model
    p = prompt_ids(tokenizer, 11)
    await engine.start()
    out = await engine.generate(p, greedy(12))
    assert out.finished and out.output_token_ids == solo_tokens(model, tokenizer, p, 12)
    assert out.output_text == tokenizer.decode(out.output_token_ids)


async def test_stream_outputs_yields_each_step_until_finished(engine, tiny_model):
    _, tokenizer = tiny_model
    rid = await engine.add_request(prompt_ids(tokenizer, 9), greedy(10, ignore_eos=True), request_id="s")
    outs = [o async for o in engine.stream_outputs(rid)]
    assert outs[-1].finished and sum(not o.finished for o in outs) == len(outs) - 1
    assert [t for o in outs for t in o.new_token_ids] == outs[-1].output_token_ids
    assert "".join(o.new_text for o in outs) == outs[-1].output_text
    assert engine.get_stats()["active_requests"] == 0


async def test_stream_interval_coalesces_outputs(tiny_model):
    model, tokenizer = tiny_model
    engine = EngineCore(model, tokenizer, EngineConfig(stream_interval=4))
    try:
        rid = await engine.add_request(prompt_ids(tokenizer, 9), greedy(10, ignore_eos=True))
        outs = [o async for o in engine.stream_outputs(rid)]
        assert all(len(o.new_token_ids) >= 4 for o in outs[:-1])
        assert [t for o in outs for t in o.new_token_ids] == outs[-1].output_token_ids
        assert len(outs[-1].output_token_ids) == 10
    finally:
        engine.close()


async def test_inactivity_timeout_aborts_the_orphaned_request(engine, tiny_model):
    _, tokenizer = tiny_model
    finals = []
    engine.add_output_listener(lambda outs: finals.extend(o for o in outs if o.finished))
    sp = greedy(50, ignore_eos=True, logits_processors=[_slow_processor(0.3)])
    rid = await engine.add_request(prompt_ids(tokenizer, 5), sp, request_id="slow")
    got = [o async for o in engine.stream_outputs(rid, timeout=0.05)]
    assert not any(o.finished for o in got)
    for _ in range(200):
        if finals:
            break
        await asyncio.sleep(0.05)
    assert [(o.request_id, o.finish_reason) for o in finals] == [("slow", "abort")]
    assert finals[0].completion_tokens < 50


async def test_consumer_that_stops_reading_aborts_its_request(engine, tiny_model):
    _, tokenizer = tiny_model
    finals = []
    engine.add_output_listener(lambda outs: finals.extend(o for o in outs if o.finished))
    rid = await engine.add_request(prompt_ids(tokenizer, 5), greedy(3000, ignore_eos=True))
    stream = engine.stream_outputs(rid)
    await stream.__anext__()
    await stream.aclose()
    for _ in range(200):
        if finals:
            break
        await asyncio.sleep(0.05)
    assert finals and finals[0].finish_reason == "abort"


async def test_duplicate_request_id_is_refused_without_disturbing_the_first(engine, tiny_model):
    model, tokenizer = tiny_model
    p = prompt_ids(tokenizer, 8)
    rid = await engine.add_request(p, greedy(10), request_id="dup")
    with pytest.raises(DuplicateRequest):
        await engine.add_request(prompt_ids(tokenizer, 3), greedy(2), request_id="dup")
    with pytest.raises(DuplicateRequest):
        engine.submit(Request("dup", [5, 6], greedy(2)))
    outs = [o async for o in engine.stream_outputs(rid)]
    assert outs[-1].output_token_ids == solo_tokens(model, tokenizer, p, 10)


def test_generate_batch_sync_works_without_a_started_loop(engine, tiny_model):
    model, tokenizer = tiny_model
    prompts = [prompt_ids(tokenizer, n) for n in (4, 9, 15)]
    outs = engine.generate_batch_sync(prompts, greedy(6))
    assert [o.output_token_ids for o in outs] == [solo_tokens(model, tokenizer, p, 6) for p in prompts]


async def test_generate_batch_sync_never_swallows_other_callers_outputs(engine, tiny_model):
    _, tokenizer = tiny_model
    await engine.start()
    rid = await engine.add_request(prompt_ids(tokenizer, 6), greedy(40, ignore_eos=True), request_id="other")
    results = {}
    worker = threading.Thread(target=lambda: results.update(
        batch=engine.generate_batch_sync([prompt_ids(tokenizer, 7)], greedy(5, ignore_eos=True))))
    worker.start()
    outs = [o async for o in engine.stream_outputs(rid)]
    await asyncio.to_thread(worker.join, 60)
    assert len(results["batch"][0].output_token_ids) == 5
    assert [t for o in outs for t in o.new_token_ids] == outs[-1].output_token_ids
    assert len(outs[-1].output_token_ids) == 40


def test_idle_engine_thread_blocks_and_wakes_at_once_for_a_request(engine, tiny_model):
    _, tokenizer = tiny_model
    engine.start()
    time.sleep(0.1)
    idle_start = engine.loop_iterations
    time.sleep(0.4)
    assert engine.loop_iterations == idle_start  # no polling while idle
    outs = engine.generate_batch_sync([prompt_ids(tokenizer, 5)], greedy(3, ignore_eos=True))
    assert outs[0].completion_tokens == 3
    time.sleep(0.1)
    settled = engine.loop_iterations
    time.sleep(0.3)
    assert engine.loop_iterations == settled


def test_sync_host_api_submit_abort_and_listener_on_the_engine_thread(engine, tiny_model):
    _, tokenizer = tiny_model
    seen: list = []
    threads: set[str] = set()
    got_tokens = threading.Event()
    finished = threading.Event()

    def listener(outputs):
        threads.add(threading.current_thread().name)
        seen.extend(outputs)
        if any(o.new_token_ids for o in outputs):
            got_tokens.set()
        if any(o.finished for o in outputs):
            finished.set()

    created_on = []
    factory = engine.scheduler._runner_factory
    engine.scheduler._runner_factory = lambda m, c: created_on.append(threading.current_thread()) or factory(m, c)
    engine.add_output_listener(listener)
    engine.submit(Request("job", prompt_ids(tokenizer, 6), greedy(5000, ignore_eos=True)))
    assert got_tokens.wait(30)
    assert engine.abort("job") is True
    assert finished.wait(30)
    assert seen[-1].request_id == "job" and seen[-1].finish_reason == "abort"
    assert threads == {engine._thread.name} and created_on == [engine._thread]
    assert factory is LanedRunner
    assert engine.abort("job") is False


def test_stop_ends_the_engine_thread_and_finishes_inflight_requests_with_abort(engine, tiny_model):
    _, tokenizer = tiny_model
    finals = []
    engine.add_output_listener(lambda outs: finals.extend(o for o in outs if o.finished))
    engine.submit(Request("long", prompt_ids(tokenizer, 6), greedy(5000, ignore_eos=True)))
    while not engine.get_stats()["steps_executed"]:
        time.sleep(0.01)
    thread = engine._thread
    engine.stop()
    assert not thread.is_alive()
    assert [(o.request_id, o.finish_reason) for o in finals] == [("long", "abort")]
    assert engine.scheduler.runner is None  # generator released on its own thread


async def test_async_engine_core_context_manager_starts_stops_and_closes(tiny_model):
    model, tokenizer = tiny_model
    async with AsyncEngineCore(model, tokenizer) as core:
        assert core.engine.is_running()
        out = await core.generate(prompt_ids(tokenizer, 5), greedy(3, ignore_eos=True))
        assert out.completion_tokens == 3
        stats = core.get_stats()
        for key in ("running", "uptime_seconds", "steps_executed", "active_requests", "stream_interval",
                    "requests", "num_waiting", "num_running", "num_requests_processed",
                    "total_prompt_tokens", "total_completion_tokens", "memory"):
            assert key in stats
        thread = core.engine._thread
    assert not thread.is_alive()
    with pytest.raises(EngineClosed):
        await core.add_request([5, 6], greedy(2))


def test_a_model_owned_by_an_open_engine_is_refused_without_force(engine, tiny_model):
    from engine_worker.engine_core import ModelInUse

    model, tokenizer = tiny_model
    with pytest.raises(ModelInUse):
        EngineCore(model, tokenizer, force_model_ownership=False)
    engine.close()
    EngineCore(model, tokenizer, force_model_ownership=False).close()


async def test_a_fatal_engine_error_finishes_every_request_with_an_error_and_refuses_new_ones(engine, tiny_model):
    from engine_worker.common.errors import EngineFatalError

    _, tokenizer = tiny_model

    def broken_step(*_args):
        raise RuntimeError("scheduler bug")

    engine.scheduler.step = broken_step
    rid = await engine.add_request(prompt_ids(tokenizer, 5), greedy(5))
    outs = [o async for o in engine.stream_outputs(rid, timeout=30)]
    assert outs[-1].finished and outs[-1].finish_reason == "error" and "scheduler bug" in outs[-1].error
    assert not engine.is_running()
    with pytest.raises(EngineFatalError):
        engine.submit(Request("later", [5, 6], greedy(2)))


def test_a_request_submitted_right_after_stop_runs_on_a_fresh_engine_thread(engine, tiny_model):
    _, tokenizer = tiny_model
    first = engine.generate_batch_sync([prompt_ids(tokenizer, 5)], greedy(2, ignore_eos=True))
    old = engine._thread
    engine.stop()
    again = engine.generate_batch_sync([prompt_ids(tokenizer, 5)], greedy(2, ignore_eos=True))
    assert first[0].completion_tokens == again[0].completion_tokens == 2
    assert engine._thread is not old and engine.is_running()


def test_engine_waits_instead_of_spinning_while_only_an_ssd_deferred_request_is_left(engine, tiny_model):
    _, tokenizer = tiny_model
    lifecycle = engine.scheduler._lifecycle
    release = threading.Event()
    real_defer = lifecycle.defer

    def defer_until_released(request):
        # Stands in for a background SSD read that takes 0.3 s: deferred (and looked up again
        # at a later step) until then, as the SSD wait policy does.
        if release.is_set():
            return real_defer(request)
        request.remaining_tokens = None
        return True

    lifecycle.defer = defer_until_released
    engine.start()
    rid = engine.submit(Request("deferred", prompt_ids(tokenizer, 5), greedy(2, ignore_eos=True)))
    time.sleep(0.05)
    start = engine.loop_iterations
    time.sleep(0.3)
    spun = engine.loop_iterations - start
    release.set()
    assert spun < 150, f"{spun} loop iterations in 0.3 s with nothing to run"
    assert engine.scheduler.get_num_waiting() + engine.scheduler.get_num_running() <= 1
    deadline = time.time() + 30
    while engine.scheduler.get_request(rid) is not None and time.time() < deadline:
        time.sleep(0.02)
    assert engine.scheduler.get_request(rid) is None  # it ran and finished once released
