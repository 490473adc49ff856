"""Prefix-cache back ends behind :class:`engine_worker.cache.protocol.PrefixCacheBackend`.

* :class:`MemoryAwarePrefixCache` (default): byte budget, LRU, KV quantization, SSD tier.
* :class:`PrefixCacheManager`: the legacy entry-count LRU.
* :class:`BlockAwarePrefixCache` over a :class:`PagedCacheManager`: shared fixed-size blocks.

:func:`build_prefix_cache` picks one from a ``SchedulerConfig``.
"""

from engine_worker.cache.factory import build_prefix_cache, memory_cache_config
from engine_worker.cache.memory_cache import MemoryAwarePrefixCache, MemoryCacheConfig
from engine_worker.cache.paged_blocks import BlockTable, PagedCacheManager
from engine_worker.cache.paged_cache import BlockAwarePrefixCache
from engine_worker.cache.prefix_cache import PrefixCacheManager
from engine_worker.cache.ssd_tier import SSDCacheConfig, SSDCacheTier, SSDCandidate
from engine_worker.cache.types import CacheHit, MatchType

__all__ = [
    "BlockAwarePrefixCache",
    "BlockTable",
    "CacheHit",
    "MatchType",
    "MemoryAwarePrefixCache",
    "MemoryCacheConfig",
    "PagedCacheManager",
    "PrefixCacheManager",
    "SSDCacheConfig",
    "SSDCacheTier",
    "SSDCandidate",
    "build_prefix_cache",
    "memory_cache_config",
]
