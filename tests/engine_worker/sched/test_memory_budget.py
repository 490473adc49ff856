"""One memory budget per worker: its size on each device, its parts, and mlx's allocator limits."""

from __future__ import annotations

import mlx.core as mx
import pytest

from engine_worker.common.config import EngineConfig, SchedulerConfig
from engine_worker.common.request import SamplingParams
from engine_worker.engine_core import EngineCore
from engine_worker.runner import device_memory
from engine_worker.runner.device_memory import ModelDims, weights_bytes
from engine_worker.sched.memory import MemoryBudget

GB = 1 << 30


def make_prompts(tokenizer, n: int) -> list[list[int]]:
    """``n`` prompts of 16-128 tokens, varied as the benchmarks' are."""
    from tests.engine_worker.engine_helpers import prompt_ids

    return [prompt_ids(tokenizer, 16 + (i * 37) % 113, f"v{i} = {i} * x\n") for i in range(n)]


@pytest.fixture
def allocator_limits():
    """Restore mlx's process-wide limits after a test that starts an engine."""
    limit, cache = mx.get_memory_limit(), mx.set_cache_limit(0)
    mx.set_cache_limit(cache)
    yield
    mx.set_memory_limit(limit)
    mx.set_cache_limit(cache)


@pytest.mark.parametrize(("info", "expected"), [
    ({"total_memory": 80 * GB, "device_name": "H100"}, 80 * GB),  # CUDA reports no memory_size
    ({"memory_size": 64 * GB, "max_recommended_working_set_size": 48 * GB}, 48 * GB),  # Metal: the GPU's share
])
def test_the_budget_is_a_share_of_the_memory_the_device_reports(monkeypatch, info, expected):
    monkeypatch.setattr(mx, "device_info", lambda: info)
    assert device_memory.device_memory_bytes()[0] == expected


def test_on_the_cpu_build_the_budget_is_a_share_of_ram(monkeypatch):
    import os

    monkeypatch.setattr(mx, "device_info", lambda: {"architecture": "x86_64"})
    assert device_memory.device_memory_bytes() == (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical_ram")


def test_an_engine_bounds_mlx_to_its_budget_on_a_cuda_device(tiny_model, monkeypatch, allocator_limits):
    monkeypatch.setattr(mx, "device_info", lambda: {"total_memory": 10 * GB})
    model, tokenizer = tiny_model
    engine = EngineCore(model, tokenizer, EngineConfig(gpu_memory_utilization=0.3))
    try:
        budget = engine.memory_budget
        assert budget.total == int(10 * GB * 0.3)
        engine.generate_batch_sync([[5, 6, 7]], SamplingParams(max_tokens=2, temperature=0.0))
        assert engine.memory_limit_bytes == budget.total == mx.get_memory_limit()
        limit = mx.set_cache_limit(0)
        mx.set_cache_limit(limit)
        # The budget reserves a bounded share for freed buffers; mlx keeps about one step's
        # working memory of them, measured, not the whole reserve (it filled with KV buffers
        # that no later step reuses).
        assert budget.allocator_cache == budget.total // 16
        assert budget.step_bytes <= limit == engine.get_stats()["memory"]["cache_limit_bytes"]
        assert limit <= budget.allocator_cache // 4
    finally:
        engine.close()


def test_the_prefix_cache_is_carved_out_of_the_budget_not_the_device(tiny_model, monkeypatch):
    monkeypatch.setattr(mx, "device_info", lambda: {"total_memory": 10 * GB})
    model, tokenizer = tiny_model
    engine = EngineCore(model, tokenizer, EngineConfig(gpu_memory_utilization=0.5))
    try:
        limit = engine.get_cache_stats()["bytes_limit"]
        assert limit == int(int(10 * GB * 0.5) * 0.2) == engine.memory_budget.prefix_cache
    finally:
        engine.close()


def test_cache_memory_mb_still_means_megabytes(tiny_model):
    model, tokenizer = tiny_model
    engine = EngineCore(model, tokenizer, EngineConfig(scheduler_config=SchedulerConfig(cache_memory_mb=3)))
    try:
        assert engine.get_cache_stats()["bytes_limit"] == 3 << 20 == engine.memory_budget.prefix_cache
    finally:
        engine.close()


def test_settings_that_cannot_fit_the_budget_fail_at_start(tiny_model):
    model, _tokenizer = tiny_model
    weights = weights_bytes(model)
    with pytest.raises(ValueError, match="GPU_MEMORY_UTILIZATION"):
        MemoryBudget.for_model(model, SchedulerConfig(), 0.5, device_bytes=weights)
    with pytest.raises(ValueError, match="cache_memory_mb"):
        MemoryBudget.for_model(model, SchedulerConfig(cache_memory_mb=10_000), 0.5, device_bytes=GB)


def test_model_dims_give_the_kv_bytes_of_a_token(tiny_model):
    model, _tokenizer = tiny_model
    dims = ModelDims.of(model)
    # tiny: 4 layers, 2 KV heads of 64, float32 keys and values.
    assert dims.kv_bytes_per_token == 2 * 4 * 2 * 64 * 4
    assert ModelDims.of(object()) is None


def test_a_model_whose_size_cannot_be_measured_is_accepted_and_the_budget_counts_what_it_can():
    """The seed takes any model object (its own tests build a Scheduler over a MagicMock): such a
    model's weights count 0 and its KV is not budgeted, instead of failing the constructor."""
    from unittest.mock import MagicMock

    from engine_worker.common.request import Request
    from engine_worker.sched.scheduler import Scheduler

    tokenizer = MagicMock()
    tokenizer.encode = lambda text: list(range(len(text.split())))
    model = MagicMock()
    assert weights_bytes(model) == 0 and ModelDims.of(model) is None
    scheduler = Scheduler(model, tokenizer, SchedulerConfig(max_num_seqs=32))
    budget = scheduler.memory_budget
    assert budget.weights == 0 and budget.dims is None and budget.total > budget.allocator_cache > 0
    for i in range(3):
        scheduler.add_request(Request(f"r{i}", f"a prompt {i}", SamplingParams(max_tokens=4)))
    assert scheduler.get_num_waiting() == 3


def test_stats_and_heartbeat_show_the_budget_and_its_parts(tiny_model):
    from engine_worker.runtime.heartbeat import build_heartbeat

    model, tokenizer = tiny_model
    engine = EngineCore(model, tokenizer, EngineConfig(scheduler_config=SchedulerConfig(cache_memory_mb=8)))
    try:
        engine.generate_batch_sync([list(range(5, 200))], SamplingParams(max_tokens=4, temperature=0.0))
        stats = engine.get_stats()
        mem = stats["memory"]
        assert mem["budget_bytes"] == engine.memory_budget.total
        assert mem["weights_bytes"] == weights_bytes(model) > 1_000_000
        assert mem["prefix_cache_bytes"] > 0 and mem["prefix_cache_limit_bytes"] == 8 << 20
        assert engine.memory_budget.step_bytes <= mem["cache_limit_bytes"] <= engine.memory_budget.allocator_cache
        beat = build_heartbeat(worker_id="w", model="tiny", stats=stats, cache=engine.get_cache_stats())
        assert beat.memory.budget_bytes == mem["budget_bytes"] and beat.memory.weights_bytes == mem["weights_bytes"]
        assert beat.memory.prefix_cache_bytes == mem["prefix_cache_bytes"]
    finally:
        engine.close()


def test_kv_bytes_show_while_requests_run(tiny_model):
    from engine_worker.sched.scheduler import Scheduler

    model, tokenizer = tiny_model
    scheduler = Scheduler(model, tokenizer, SchedulerConfig(enable_prefix_cache=False))
    from engine_worker.common.request import Request

    scheduler.add_request(Request("a", list(range(5, 40)), SamplingParams(max_tokens=8, temperature=0.0)))
    scheduler.step()
    scheduler.step()
    assert scheduler.get_stats()["memory"]["kv_bytes"] >= 35 * ModelDims.of(model).kv_bytes_per_token
    scheduler.close()


@pytest.mark.parametrize(("exc", "expected"), [
    (RuntimeError("cudaMallocAsync(&data, size, stream) failed: out of memory"), True),
    (RuntimeError("[metal::malloc] Resource limit (499000) exceeded."), True),
    (MemoryError(), True),
    (TypeError("'NoneType' object is not subscriptable"), False),  # a bug, whatever it says
    (ValueError("out of memory"), False),
    (RecursionError("maximum recursion depth exceeded"), False),  # a RuntimeError subclass
])
def test_allocation_failures_are_told_by_type_not_message(exc, expected):
    assert device_memory.is_allocation_failure(exc) is expected


def test_the_allocator_keeps_about_one_step_of_freed_buffers_after_a_full_batch(tiny_model, allocator_limits):
    """128 requests of varied lengths join and finish: their KV buffers change size at every join
    and finish. What mlx keeps afterwards is bounded by the measured step, not by 1/16 of the
    budget (before: 1.3 GiB of freed buffers kept on this machine's budget)."""
    model, tokenizer = tiny_model
    config = EngineConfig(scheduler_config=SchedulerConfig(completion_batch_size=128, enable_prefix_cache=False))
    engine = EngineCore(model, tokenizer, config)
    try:
        engine.generate_batch_sync(make_prompts(tokenizer, 128), SamplingParams(max_tokens=24, temperature=0.0))
        limit = engine.get_stats()["memory"]["cache_limit_bytes"]
        assert mx.get_cache_memory() <= limit < engine.memory_budget.total // 16 // 4
    finally:
        engine.close()
