"""BufferRelease: mlx's cached free buffers go back to the device after a finish and every N busy steps."""

from __future__ import annotations

import mlx.core as mx
import pytest

from engine_worker.common.config import EngineConfig, SchedulerConfig
from engine_worker.engine_core import EngineCore
from engine_worker.runner.buffer_release import BufferRelease
from tests.engine_worker.engine_helpers import greedy, prompt_ids


@pytest.fixture
def cached_buffer():
    """Leaves a freed 4 MB buffer in mlx's allocator cache; restores the cache limit after."""
    previous = mx.set_cache_limit(1 << 30)

    def free_one() -> None:
        a = mx.ones((1024, 1024))
        mx.eval(a)
        del a
        assert mx.get_cache_memory() > 0

    yield free_one
    mx.set_cache_limit(previous)


def test_a_step_in_which_a_request_finished_clears_the_cache(cached_buffer):
    release = BufferRelease(every=32)
    cached_buffer()
    release.after_step(busy=True, finished=False)
    assert mx.get_cache_memory() > 0
    release.after_step(busy=True, finished=True)
    assert mx.get_cache_memory() == 0 and release.releases == 1


def test_every_nth_busy_step_clears_the_cache_and_idle_steps_do_not_count(cached_buffer):
    release = BufferRelease(every=4)
    cached_buffer()
    for _ in range(3):
        release.after_step(busy=True, finished=False)
    for _ in range(5):
        release.after_step(busy=False, finished=False)
    assert mx.get_cache_memory() > 0 and release.releases == 0
    release.after_step(busy=True, finished=False)
    assert mx.get_cache_memory() == 0 and release.releases == 1


def test_every_must_be_positive():
    with pytest.raises(ValueError):
        BufferRelease(every=0)


async def test_the_engine_leaves_no_cached_buffers_once_its_requests_finished(tiny_model):
    model, tokenizer = tiny_model
    previous = mx.set_cache_limit(1 << 30)  # a limit as large as a GPU's budget would allow
    engine = EngineCore(model, tokenizer, EngineConfig(scheduler_config=SchedulerConfig(enable_prefix_cache=False)))
    try:
        await engine.start()
        mx.set_cache_limit(1 << 30)  # the engine set its budget's limit when it started
        outs = [await engine.generate(prompt_ids(tokenizer, 9 + i), greedy(20, ignore_eos=True)) for i in range(3)]
        assert all(out.finished for out in outs)
        assert mx.get_cache_memory() == 0
    finally:
        engine.close()
        mx.set_cache_limit(previous)
