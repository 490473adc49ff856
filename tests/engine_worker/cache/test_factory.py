"""build_prefix_cache picks the back end from the SchedulerConfig fields, as the seed does."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine_worker.cache import (
    BlockAwarePrefixCache,
    MemoryAwarePrefixCache,
    PrefixCacheManager,
    build_prefix_cache,
)
from engine_worker.cache.protocol import PrefixCacheBackend
from engine_worker.common.config import SchedulerConfig


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({}, MemoryAwarePrefixCache),
        ({"use_paged_cache": True}, BlockAwarePrefixCache),
        ({"use_memory_aware_cache": False}, PrefixCacheManager),
    ],
)
def test_backend_follows_the_config_precedence(tiny_model, fields, expected):
    cache = build_prefix_cache(tiny_model[0], SchedulerConfig(**fields))
    assert type(cache) is expected
    assert isinstance(cache, PrefixCacheBackend)


def test_disabled_prefix_cache_builds_nothing(tiny_model):
    assert build_prefix_cache(tiny_model[0], SchedulerConfig(enable_prefix_cache=False)) is None


def test_config_fields_reach_the_backend(tiny_model, tmp_path):
    config = SimpleNamespace(
        enable_prefix_cache=True, use_paged_cache=False, use_memory_aware_cache=True,
        cache_memory_mb=12, cache_memory_percent=0.2, kv_cache_quantization=True,
        kv_cache_quantization_bits=4, kv_cache_quantization_group_size=32,
        kv_cache_min_quantize_tokens=99, ssd_cache_dir=str(tmp_path / "ssd"), ssd_cache_max_gb=0.5)
    cache = build_prefix_cache(tiny_model[0], config)
    try:
        assert cache.get_stats()["bytes_limit"] == 12 * 2**20
        assert (cache.config.kv_bits, cache.config.kv_group_size, cache.config.kv_min_quantize_tokens) == (4, 32, 99)
        assert cache.ssd_tier is not None and cache.ssd_tier.max_bytes == int(0.5 * 2**30)
    finally:
        cache.ssd_tier.close()


def test_legacy_and_paged_sizes_come_from_the_config(tiny_model):
    legacy = build_prefix_cache(tiny_model[0], SchedulerConfig(use_memory_aware_cache=False, prefix_cache_size=7))
    assert legacy.max_entries == 7
    paged = build_prefix_cache(tiny_model[0], SchedulerConfig(use_paged_cache=True, paged_cache_block_size=32,
                                                              max_cache_blocks=50))
    assert (paged.manager.block_size, paged.manager.max_blocks) == (32, 50)


@pytest.mark.parametrize("fields", [{}, {"use_paged_cache": True}, {"use_memory_aware_cache": False}])
def test_every_backend_reports_the_operator_stats_keys(tiny_model, fields):
    stats = build_prefix_cache(tiny_model[0], SchedulerConfig(cache_memory_mb=8, **fields)).get_stats()
    for key in ("hits", "misses", "hit_rate", "entries", "bytes_used", "bytes_limit", "evictions",
                "quantized_entries", "ssd_entries", "ssd_bytes", "ssd_hits", "promotions", "failures"):
        assert key in stats, key
