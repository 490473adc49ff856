"""The memory-aware prefix cache (the default back end): a byte budget, LRU eviction, optional KV
quantization of stored entries, and an optional SSD tier for what RAM evicts.

Contract (see :mod:`engine_worker.cache.protocol`): :meth:`fetch` returns
``(cache_layers | None, remaining_tokens, hit_type)`` where ``cache_layers`` is a fresh copy
covering at most ``len(tokens) - 1`` tokens, so ``remaining_tokens`` is never empty.
:meth:`store` snapshots a finished (or partially prefilled) request's cache under its tokens; the
entry is refused, never squeezed in, when it alone exceeds the budget, so ``bytes_used`` never
exceeds ``bytes_limit``.

What is stored on finish is prompt + output (multi-turn reuse). A cache that cannot be trimmed
to a shorter prefix (a sliding-window ``RotatingKVCache`` that wrapped, under ``max_kv_size``) is
stored whole under exactly the tokens it holds and only serves prompts that extend them (the next
turn); the scheduler therefore also stores a prompt-only snapshot of such a request, taken when
its prompt is processed (``stores_wrapped_windows``; see :mod:`engine_worker.cache.hooks`),
so the same prompt with another follow-up hits too. Recurrent (``ArraysCache``) state is not
stored.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from engine_worker.cache import entry_io, kv
from engine_worker.cache.budget import MB, resolve_budget_bytes
from engine_worker.cache.index import as_token_array
from engine_worker.cache.persistence import load_entries, save_entries
from engine_worker.cache.protocol import PrefixCacheBackend, StoreItem
from engine_worker.cache.ssd_tier import SSDCacheTier
from engine_worker.cache.store import Entry, EntryStore
from engine_worker.cache.types import (
    CacheCounters,
    CacheHit,
    EntryInfo,
    MatchType,
    UnsupportedCache,
    key_hash,
)

logger = logging.getLogger(__name__)


@dataclass
class MemoryCacheConfig:
    """The seed's knobs. ``max_memory_mb`` wins over ``max_memory_percent``, a fraction of
    ``total_bytes`` (the engine passes its worker's memory budget; by default the device's
    memory, see :func:`engine_worker.runner.device_memory.device_memory_bytes`)."""

    max_memory_mb: float | None = None
    max_memory_percent: float = 0.2
    kv_quantize: bool = False
    kv_bits: int = 8
    kv_group_size: int = 64
    kv_min_quantize_tokens: int = 256
    total_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.kv_bits not in (4, 8):
            raise ValueError("kv_bits must be 4 or 8")
        if self.kv_group_size not in (32, 64, 128):
            raise ValueError("kv_group_size must be 32, 64 or 128")


class _Stored(NamedTuple):
    """A key found in the store when a cache was staged: committing it is an LRU touch."""

    key: str
    tokens: np.ndarray


class MemoryAwarePrefixCache(PrefixCacheBackend):
    name = "memory_aware_cache"
    active = True
    #: Stores wrapped sliding windows whole: the scheduler takes prompt-only snapshots for it.
    stores_wrapped_windows = True

    def __init__(self, model: Any, config: MemoryCacheConfig | None = None) -> None:
        self.model = model
        self.config = config or MemoryCacheConfig()
        self._max_bytes = resolve_budget_bytes(self.config.max_memory_mb, self.config.max_memory_percent,
                                               self.config.total_bytes)
        # The configured limit; set_byte_limit lowers the store's below it.
        self._store = EntryStore(max_bytes=self._max_bytes)
        self._counters = CacheCounters()
        self._ssd: SSDCacheTier | None = None

    # ---- the scheduler's seam -------------------------------------------------------------------
    @property
    def memory_limit_mb(self) -> float:
        return (self._store.max_bytes or 0) / MB

    @property
    def bytes_used(self) -> int:
        """Bytes of the entries in RAM (cheap: a counter)."""
        return self._store.bytes_used

    def set_byte_limit(self, max_bytes: int) -> int:
        """Hold at most ``min(max_bytes, the configured limit)`` from now on: least recently used
        entries are evicted (to the SSD tier, if any) until the entries fit, and later stores stay
        within it. The scheduler lowers it while running requests need the memory and raises it
        back when they finish. Returns the bytes evicted."""
        limit = max(0, min(int(max_bytes), self._max_bytes))
        if limit == self._store.max_bytes:
            return 0
        evicted = self._store.set_max_bytes(limit)
        if evicted:
            with self._store.lock:
                self._counters.evictions += len(evicted)
            for old in evicted:
                self._spill(old)
        return sum(e.nbytes for e in evicted)

    def fetch(self, tokens: Sequence[int]) -> tuple[list[Any] | None, list[int], str]:
        """``(cache_layers | None, remaining_tokens, hit_type)``; see the module docstring."""
        return self.lookup(tokens).as_tuple()

    def lookup(self, tokens: Sequence[int]) -> CacheHit:
        """Like :meth:`fetch`, as a :class:`CacheHit`. With an SSD tier, a disk entry that would
        cover more than RAM does is queued for a background read and the result says
        ``ssd_pending`` (on a RAM miss); a later lookup serves it from RAM as ``ssd_hit``."""
        self.absorb_promotions()
        arr = as_token_array(tokens)
        hit = self._store.lookup(arr)
        if self._ssd is not None and len(arr) > 1:
            candidate = self._ssd.best_match(arr)
            if candidate is not None and candidate.matched_tokens > hit.cached_tokens:
                self._ssd.request_load(candidate)
                if hit.cache is None:
                    hit = CacheHit.miss(tokens, MatchType.SSD_PENDING)
        with self._store.lock:
            self._counters.record(hit.match_type, hit.cached_tokens)
        if hit.match_type is MatchType.SSD_HIT and self._ssd is not None:
            self._ssd.count("ssd_hits")
        return hit

    def store(self, tokens: Sequence[int], cache_layers: list[Any], evict_prefixes: bool = True) -> bool:
        """Snapshot ``cache_layers`` under ``tokens``; returns whether an entry now exists.

        The key is cut to the cache's offset when the cache holds fewer positions than tokens
        (e.g. a last sampled token that was never fed). ``tokens`` may be a prompt prefix with a
        partial cache (mid-prefill saves). Dominated prefix entries are dropped
        (``evict_prefixes``). Runs on the engine thread; no disk I/O (spills are queued).
        """
        staged = self._stage(tokens, cache_layers)
        if isinstance(staged, Entry):
            kv.evaluate_all([staged.snap])
        return self._commit(staged, cache_layers, evict_prefixes)

    def store_many(self, items: Sequence[StoreItem]) -> None:
        """:meth:`store` each item, then drop the entry it replaces, in order, with the copies of
        all the items evaluated in one ``mx.eval`` (a step's finished requests: one device sync)."""
        staged = [self._stage(item.tokens, item.cache_layers) for item in items]
        kv.evaluate_all([s.snap for s in staged if isinstance(s, Entry)])
        for item, one in zip(items, staged, strict=True):
            self._commit(one, item.cache_layers, evict_prefixes=True)
            if item.replaces is not None:
                self.replace_turn(item.replaces)

    def _stage(self, tokens: Sequence[int], cache_layers: list[Any]) -> Entry | _Stored | None:
        """What storing ``cache_layers`` under ``tokens`` takes: an entry whose snapshot is not
        evaluated yet, the key of an entry already stored (an LRU touch), or None (refused)."""
        if not cache_layers or not kv.is_storable(cache_layers):
            self._reject("not storable")
            return None
        n = min(len(tokens), kv.cache_offset(cache_layers))
        if n < self._store.min_tokens:
            return None
        key_tokens = as_token_array(tokens[:n])
        key = key_hash(key_tokens.tolist())
        if key in self._store:
            return _Stored(key, key_tokens)
        return self._lazy_entry(key, key_tokens, cache_layers)

    def _lazy_entry(self, key: str, key_tokens: np.ndarray, cache_layers: list[Any]) -> Entry | None:
        """An entry of ``key_tokens`` whose snapshot is not evaluated yet; None when refused."""
        try:
            snap = kv.snapshot(cache_layers, len(key_tokens), evaluate=False)
        except UnsupportedCache as exc:
            self._reject(str(exc))
            return None
        return Entry(key, key_tokens, self._maybe_quantize(snap))

    def _commit(self, staged: Entry | _Stored | None, cache_layers: list[Any], evict_prefixes: bool) -> bool:
        """Keep what :meth:`_stage` prepared (its snapshot evaluated); whether an entry now exists."""
        if staged is None:
            return False
        with self._store.lock:
            existing = self._store.get(staged.key)
            if existing is not None:  # stored already, or by an earlier item of the same batch
                self._store.insert(existing, evict_prefixes=False)  # LRU touch
                return True
        if isinstance(staged, _Stored):  # the entry was evicted since it was staged: copy it now
            entry = self._lazy_entry(staged.key, staged.tokens, cache_layers)
            if entry is None:
                return False
            kv.evaluate_all([entry.snap])
            return self._insert(entry, evict_prefixes)
        return self._insert(staged, evict_prefixes)

    def remove(self, tokens: Sequence[int]) -> bool:
        return self.evict(key_hash(list(tokens)))

    def evict(self, key: str) -> bool:
        """Drop one entry by key hash from every tier (the operator's action)."""
        removed = self._store.remove(key) is not None
        if self._ssd is not None:
            removed = self._ssd.remove(key) or removed
        return removed

    def replace_turn(self, key: str) -> None:
        self.evict(key)

    def clear(self, include_ssd: bool = False) -> int:
        """Drop every RAM entry (and the disk tier when asked; the seed leaves disk alone)."""
        count = self._store.clear()
        if include_ssd and self._ssd is not None:
            count += self._ssd.clear()
        return count

    # ---- quantization --------------------------------------------------------------------------
    def _maybe_quantize(self, snap: kv.KVSnapshot) -> kv.KVSnapshot:
        """The snapshot to keep, quantized when configured; lazy, like ``snap``."""
        cfg = self.config
        if not cfg.kv_quantize or snap.num_tokens < cfg.kv_min_quantize_tokens:
            return snap
        if not kv.can_quantize(snap, cfg.kv_group_size):
            logger.debug("head dim not a multiple of %d; storing unquantized", cfg.kv_group_size)
            return snap
        return kv.quantize(snap, cfg.kv_bits, cfg.kv_group_size, evaluate=False)

    # ---- budget and spills ---------------------------------------------------------------------
    def _reject(self, reason: str) -> None:
        logger.debug("prefix cache store refused: %s", reason)
        with self._store.lock:
            self._counters.rejected += 1

    def _insert(self, entry: Entry, evict_prefixes: bool) -> bool:
        if not self._store.fits(entry.nbytes):
            self._reject(f"{entry.nbytes} bytes > budget {self._store.max_bytes}")
            return False
        evicted = self._store.insert(entry, evict_prefixes=evict_prefixes)
        with self._store.lock:
            self._counters.stores += 1
            self._counters.evictions += len(evicted)
        for old in evicted:
            self._spill(old)
        return True

    def _spill(self, entry: Entry) -> None:
        if self._ssd is None:
            return
        host = entry_io.to_host(entry.tokens, entry.snap)
        self._ssd.spill(entry.key, host, entry.nbytes, entry.snap.quantized)

    # ---- SSD tier ------------------------------------------------------------------------------
    def set_ssd_tier(self, tier: SSDCacheTier | None) -> None:
        self._ssd = tier

    @property
    def ssd_tier(self) -> SSDCacheTier | None:
        return self._ssd

    def close(self) -> None:
        """Flush and stop the SSD tier, if any (its pending writes reach the disk)."""
        if self._ssd is not None:
            self._ssd.close()

    def absorb_promotions(self) -> int:
        """Move entries the SSD reader finished into RAM (host → mlx copies, no disk I/O)."""
        if self._ssd is None:
            return 0
        count = 0
        for loaded in self._ssd.take_loaded():
            try:
                snap = entry_io.from_host(loaded.host)
            except (entry_io.CacheEntryCorrupt, KeyError, ValueError) as exc:
                logger.warning("SSD entry %s unusable: %s", loaded.key, exc)
                self._ssd.count("ssd_failures")
                self._ssd.remove(loaded.key)
                continue
            entry = Entry(loaded.key, np.asarray(loaded.host.tokens, dtype=np.int64), snap, promoted=True)
            if self._insert(entry, evict_prefixes=False):
                self._ssd.count("promotions")
                count += 1
        return count

    # ---- persistence ---------------------------------------------------------------------------
    def save_to_disk(self, directory: str) -> bool:
        """Write every RAM entry to ``directory`` (synchronous: call outside engine steps)."""
        entries = list(self._store.entries())
        hosts = [(e.key, entry_io.to_host(e.tokens, e.snap), e.hit_count) for e in entries]
        return save_entries(directory, hosts)

    def load_from_disk(self, directory: str) -> int:
        """Load entries saved by :meth:`save_to_disk`; corrupt files are skipped and logged.
        Returns the number of entries now in RAM from that directory."""
        loaded = 0
        for key, host in load_entries(directory):
            try:
                snap = entry_io.from_host(host)
            except (entry_io.CacheEntryCorrupt, KeyError, ValueError) as exc:
                logger.warning("persisted cache entry %s unusable: %s", key, exc)
                continue
            if self._insert(Entry(key, np.asarray(host.tokens, dtype=np.int64), snap), False):
                loaded += 1
        return loaded

    # ---- operator view -------------------------------------------------------------------------
    def list_entries(self) -> list[dict[str, Any]]:
        """One row per entry (RAM, then disk): key_hash, tokens, bytes, tier, hit_count,
        last_used, quantized. Cheap: no array work."""
        rows: list[EntryInfo] = [e.info() for e in self._store.entries()]
        if self._ssd is not None:
            rows.extend(self._ssd.entries())
        return [row.as_dict() for row in rows]

    def get_stats(self) -> dict[str, Any]:
        with self._store.lock:
            entries = list(self._store.entries())
            stats: dict[str, Any] = {
                "backend": "memory_aware",
                **self._counters.as_dict(),
                "entries": len(entries),
                "bytes_used": self._store.bytes_used,
                "bytes_limit": self._store.max_bytes,
                "memory_limit_mb": round(self.memory_limit_mb, 1),
                "quantized_entries": sum(1 for e in entries if e.snap.quantized),
                "kv_quantization": self.config.kv_quantize,
            }
        ssd = self._ssd.get_stats() if self._ssd is not None else {}
        for name in ("ssd_entries", "ssd_bytes", "ssd_hits", "promotions"):
            stats[name] = ssd.get(name, 0)
        stats["failures"] = ssd.get("ssd_failures", 0)
        stats["ssd_enabled"] = self._ssd is not None
        if ssd:
            stats["ssd"] = ssd
        return stats
