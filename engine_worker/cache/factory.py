"""Pick and build the prefix-cache back end from a ``SchedulerConfig``.

Precedence, as in the seed: ``enable_prefix_cache`` off → none; ``use_paged_cache`` → paged;
``use_memory_aware_cache`` → memory-aware (+ SSD tier when ``ssd_cache_dir`` is set); else the
legacy entry-count cache of ``prefix_cache_size`` entries.
"""

from __future__ import annotations

import logging
from typing import Any

from engine_worker.cache.budget import MB
from engine_worker.cache.memory_cache import MemoryAwarePrefixCache, MemoryCacheConfig
from engine_worker.cache.paged_blocks import PagedCacheManager
from engine_worker.cache.paged_cache import BlockAwarePrefixCache
from engine_worker.cache.prefix_cache import PrefixCacheManager
from engine_worker.cache.ssd_tier import SSDCacheConfig, SSDCacheTier
from engine_worker.common.config import SchedulerConfig

logger = logging.getLogger(__name__)

PrefixCache = MemoryAwarePrefixCache | BlockAwarePrefixCache | PrefixCacheManager


def memory_cache_config(config: SchedulerConfig, max_bytes: int | None = None) -> MemoryCacheConfig:
    """The seed's cache fields; ``max_bytes``, when given, is the limit already resolved from them
    (the engine resolves ``cache_memory_percent`` against the worker's memory budget)."""
    return MemoryCacheConfig(
        max_memory_mb=max_bytes / MB if max_bytes is not None else config.cache_memory_mb,
        max_memory_percent=config.cache_memory_percent,
        kv_quantize=config.kv_cache_quantization,
        kv_bits=config.kv_cache_quantization_bits,
        kv_group_size=config.kv_cache_quantization_group_size,
        kv_min_quantize_tokens=config.kv_cache_min_quantize_tokens,
    )


def build_prefix_cache(model: Any, config: SchedulerConfig, max_bytes: int | None = None) -> PrefixCache | None:
    """The back end ``config`` asks for, or None when prefix caching is off. The memory-aware one
    holds at most ``max_bytes`` when given (else its config fields decide).

    With an SSD tier, its I/O thread is started and its index reconciled here (start-up, not a
    step); the back end's ``close()`` flushes pending writes on shutdown.
    """
    if not config.enable_prefix_cache:
        return None
    if config.use_paged_cache:
        manager = PagedCacheManager(block_size=config.paged_cache_block_size, max_blocks=config.max_cache_blocks)
        logger.info("prefix cache: paged, %d blocks of %d tokens", manager.max_blocks, manager.block_size)
        return BlockAwarePrefixCache(model=model, paged_cache_manager=manager)
    if config.use_memory_aware_cache:
        cache = MemoryAwarePrefixCache(model=model, config=memory_cache_config(config, max_bytes))
        if config.ssd_cache_dir:
            tier = SSDCacheTier(SSDCacheConfig(cache_dir=config.ssd_cache_dir, max_size_gb=config.ssd_cache_max_gb))
            kept = tier.reconcile()
            tier.start_writer()
            cache.set_ssd_tier(tier)
            logger.info("prefix cache: SSD tier at %s with %d entries", config.ssd_cache_dir, kept)
        logger.info("prefix cache: memory-aware, limit=%.1fMB", cache.memory_limit_mb)
        return cache
    logger.info("prefix cache: legacy, %d entries", config.prefix_cache_size)
    return PrefixCacheManager(model=model, max_entries=config.prefix_cache_size)
