"""The legacy entry-count back end (``prefix_cache_size``), used when
``use_memory_aware_cache`` is off: an LRU of at most ``max_entries`` entries, no byte budget,
no quantization, no SSD tier. Same matching and alignment rules as the memory-aware cache.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from engine_worker.cache import kv
from engine_worker.cache.index import as_token_array
from engine_worker.cache.protocol import PrefixCacheBackend, StoreItem
from engine_worker.cache.store import Entry, EntryStore
from engine_worker.cache.types import NO_SSD_STATS, CacheCounters, CacheHit, UnsupportedCache, key_hash

logger = logging.getLogger(__name__)


class PrefixCacheManager(PrefixCacheBackend):
    name = "prefix_cache"
    active = True

    def __init__(self, model: Any, max_entries: int = 100) -> None:
        if max_entries <= 0:
            raise ValueError("max_entries (prefix_cache_size) must be > 0")
        self.model = model
        self.max_entries = max_entries
        self._store = EntryStore(max_entries=max_entries)
        self._counters = CacheCounters()

    # seed API ------------------------------------------------------------------------------------
    def fetch_cache(self, tokens: Sequence[int]) -> tuple[list[Any] | None, list[int]]:
        cache, remaining, _ = self.fetch(tokens)
        return cache, remaining

    def store_cache(self, tokens: Sequence[int], cache_layers: list[Any]) -> bool:
        """Snapshot ``cache_layers`` under ``tokens`` (cut to the cache's offset)."""
        entry = self._stage(tokens, cache_layers)
        if entry is None:
            return False
        kv.evaluate_all([entry.snap])
        self._insert(entry)
        return True

    def _stage(self, tokens: Sequence[int], cache_layers: list[Any]) -> Entry | None:
        """The entry storing ``cache_layers`` makes, its snapshot not evaluated yet; None when
        refused."""
        if not cache_layers or not kv.is_storable(cache_layers):
            self._counters.rejected += 1
            return None
        n = min(len(tokens), kv.cache_offset(cache_layers))
        if n < self._store.min_tokens:
            return None
        key_tokens = as_token_array(tokens[:n])
        try:
            snap = kv.snapshot(cache_layers, n, evaluate=False)
        except UnsupportedCache as exc:
            logger.debug("legacy prefix cache refused an entry: %s", exc)
            self._counters.rejected += 1
            return None
        return Entry(key_hash(key_tokens.tolist()), key_tokens, snap)

    def _insert(self, entry: Entry) -> None:
        evicted = self._store.insert(entry)
        with self._store.lock:
            self._counters.stores += 1
            self._counters.evictions += len(evicted)

    def __len__(self) -> int:
        return len(self._store)

    def __bool__(self) -> bool:
        # An empty cache is still a cache: without this, ``cache or default`` would drop it.
        return True

    # protocol ------------------------------------------------------------------------------------
    def fetch(self, tokens: Sequence[int]) -> tuple[list[Any] | None, list[int], str]:
        hit: CacheHit = self._store.lookup(as_token_array(tokens))
        with self._store.lock:
            self._counters.record(hit.match_type, hit.cached_tokens)
        return hit.as_tuple()

    def store(self, tokens: Sequence[int], cache_layers: list[Any]) -> None:
        self.store_cache(tokens, cache_layers)

    def store_many(self, items: Sequence[StoreItem]) -> None:
        """:meth:`store` each item, then drop the entry it replaces, in order, with the copies of
        all the items evaluated in one ``mx.eval``."""
        staged = [self._stage(item.tokens, item.cache_layers) for item in items]
        kv.evaluate_all([entry.snap for entry in staged if entry is not None])
        for item, entry in zip(items, staged, strict=True):
            if entry is not None:
                self._insert(entry)
            if item.replaces is not None:
                self.replace_turn(item.replaces)

    def evict(self, key: str) -> bool:
        return self._store.remove(key) is not None

    def replace_turn(self, key: str) -> None:
        self.evict(key)

    def clear(self) -> None:
        self._store.clear()

    def list_entries(self) -> list[dict[str, Any]]:
        return [e.info().as_dict() for e in self._store.entries()]

    def get_stats(self) -> dict[str, Any]:
        with self._store.lock:
            return {
                "backend": "legacy",
                **self._counters.as_dict(),
                "entries": len(self._store),
                "max_entries": self.max_entries,
                "bytes_used": self._store.bytes_used,
                "bytes_limit": None,
                "quantized_entries": 0,
                **NO_SSD_STATS,
            }
