"""The scheduler-side hooks: abort keeps the processed prefix, mid-prefill saves, SSD wait policy."""

from __future__ import annotations

from engine_worker.cache import MemoryAwarePrefixCache, MemoryCacheConfig
from engine_worker.cache.hooks import SSDWaitPolicy, store_removed_prefix
from engine_worker.cache.protocol import NoPrefixCache
from engine_worker.cache.seam import default_backend
from engine_worker.common.config import SchedulerConfig


def test_a_long_prompt_aborted_halfway_leaves_its_processed_prefix_reusable(tiny_model, prompts, greedy):
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator

    model, _ = tiny_model
    cache = MemoryAwarePrefixCache(model, MemoryCacheConfig(max_memory_mb=64))
    prompt = prompts(300)
    generator = BatchGenerator(model, prefill_step_size=64, stream=mx.default_stream(mx.default_device()))
    try:
        (uid,) = generator.insert([prompt], max_tokens=[4])
        generator.next()
        generator.next()  # two 64-token chunks prefilled, the prompt is far from done
        removed = generator.remove([uid], return_prompt_caches=True)[uid]
    finally:
        generator.close()

    assert store_removed_prefix(cache, prompt, [], removed) is True
    [row] = cache.list_entries()
    assert row["tokens"] == removed[0][0].offset and 0 < row["tokens"] < len(prompt)
    layers, remaining, hit_type = cache.fetch(prompt)
    assert hit_type == "prefix" and len(remaining) == len(prompt) - row["tokens"]
    assert greedy(remaining, layers) == greedy(prompt)


def test_ssd_wait_policy_holds_pending_requests_only_within_its_bound():
    patient = SSDWaitPolicy(max_wait_s=3600)
    assert patient.should_wait("a", "ssd_pending") is True
    assert patient.should_wait("a", "ssd_hit") is False
    impatient = SSDWaitPolicy(max_wait_s=0.0)
    assert impatient.should_wait("b", "ssd_pending") is False


def test_the_default_backend_is_a_no_op_when_prefix_caching_is_disabled(tiny_model):
    assert isinstance(default_backend(tiny_model[0], SchedulerConfig(enable_prefix_cache=False)), NoPrefixCache)
    assert default_backend(tiny_model[0], SchedulerConfig(cache_memory_mb=8)).active is True


def test_mid_prefill_saves_store_the_processed_prefix_every_interval(tiny_model, prompts, greedy):
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator

    from engine_worker.cache.hooks import MidPrefillSaver

    model, _ = tiny_model
    cache = MemoryAwarePrefixCache(model, MemoryCacheConfig(max_memory_mb=64))
    saver = MidPrefillSaver(cache, interval=64)
    prompt = prompts(300)
    generator = BatchGenerator(model, prefill_step_size=32, stream=mx.default_stream(mx.default_device()))
    saves = []
    try:
        (uid,) = generator.insert([prompt], max_tokens=[2])
        for _ in range(5):  # 5 chunks of 32 tokens: saves at 64 and 128
            generator.next()
            saves.append(saver.after_step([("r", uid, prompt)], generator.extract_cache))
        generator.remove([uid])
    finally:
        generator.close()

    assert sum(saves) == 2
    [row] = cache.list_entries()  # the 128-token save replaced the 64-token one
    assert row["tokens"] == 128
    layers, remaining, _ = cache.fetch(prompt)
    assert len(remaining) == len(prompt) - 128
    assert greedy(remaining, layers) == greedy(prompt)
