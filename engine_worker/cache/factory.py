"""Pick and build the prefix-cache back end from a ``SchedulerConfig`` (duck-typed on the seed's
field names, so this module does not import the scheduler's config).

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

logger = logging.getLogger(__name__)

PrefixCache = MemoryAwarePrefixCache | BlockAwarePrefixCache | PrefixCacheManager


def memory_cache_config(config: Any, max_bytes: int | None = None) -> MemoryCacheConfig:
    """The seed's cache fields; ``max_bytes``, when given, is the limit already resolved from them
    (the engine resolves ``cache_memory_percent`` against the worker's memory budget)."""
    return MemoryCacheConfig(
        max_memory_mb=max_bytes / MB if max_bytes is not None else getattr(config, "cache_memory_mb", None),
        max_memory_percent=getattr(config, "cache_memory_percent", 0.2),
        kv_quantize=getattr(config, "kv_cache_quantization", False),
        kv_bits=getattr(config, "kv_cache_quantization_bits", 8),
        kv_group_size=getattr(config, "kv_cache_quantization_group_size", 64),
        kv_min_quantize_tokens=getattr(config, "kv_cache_min_quantize_tokens", 256),
    )


def build_prefix_cache(model: Any, scheduler_config: Any, max_bytes: int | None = None) -> PrefixCache | None:
    """The back end ``scheduler_config`` asks for, or None when prefix caching is off. The
    memory-aware one holds at most ``max_bytes`` when given (else its config fields decide).

    With an SSD tier, its I/O thread is started and its index reconciled here (start-up, not a
    step); call ``cache.ssd_tier.close()`` on shutdown to flush pending writes.
    """
    cfg = scheduler_config
    if not getattr(cfg, "enable_prefix_cache", True):
        return None
    if getattr(cfg, "use_paged_cache", False):
        manager = PagedCacheManager(
            block_size=getattr(cfg, "paged_cache_block_size", 64),
            max_blocks=getattr(cfg, "max_cache_blocks", 1000),
        )
        logger.info("prefix cache: paged, %d blocks of %d tokens", manager.max_blocks, manager.block_size)
        return BlockAwarePrefixCache(model=model, paged_cache_manager=manager)
    if getattr(cfg, "use_memory_aware_cache", True):
        cache = MemoryAwarePrefixCache(model=model, config=memory_cache_config(cfg, max_bytes))
        ssd_dir = getattr(cfg, "ssd_cache_dir", None)
        if ssd_dir:
            tier = SSDCacheTier(SSDCacheConfig(cache_dir=ssd_dir, max_size_gb=getattr(cfg, "ssd_cache_max_gb", 10.0)))
            kept = tier.reconcile()
            tier.start_writer()
            cache.set_ssd_tier(tier)
            logger.info("prefix cache: SSD tier at %s with %d entries", ssd_dir, kept)
        logger.info("prefix cache: memory-aware, limit=%.1fMB", cache.memory_limit_mb)
        return cache
    logger.info("prefix cache: legacy, %d entries", getattr(cfg, "prefix_cache_size", 100))
    return PrefixCacheManager(model=model, max_entries=getattr(cfg, "prefix_cache_size", 100))
