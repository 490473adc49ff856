"""The prefix cache: what the scheduler asks for at admission and offers when a request ends.

* :mod:`.protocol`: :class:`PrefixCacheBackend`, what the scheduler needs from a back end;
  :mod:`.seam`: the scheduler's side of it (a failing back end never fails a request);
  :mod:`.hooks`: the steps around a request beyond fetch and store (mid-prefill saves, prompt
  snapshots, shared prefills, abort stores, SSD waits, the operator view).
* The back ends: :class:`MemoryAwarePrefixCache` (default: byte budget, LRU, KV quantization, SSD
  tier), :class:`PrefixCacheManager` (the legacy entry-count LRU), :class:`BlockAwarePrefixCache`
  over a :class:`PagedCacheManager` (shared fixed-size blocks); :func:`build_prefix_cache` picks
  one from a ``SchedulerConfig``.
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
