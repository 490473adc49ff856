"""The in-RAM entry store shared by the memory-aware and the legacy back ends.

An LRU of :class:`Entry` (token key + KV snapshot) under a byte budget and/or an entry-count
limit, plus the prefix index. It owns the hit-alignment rule, so every back end built on it
returns caches that cover at most ``len(prompt) - 1`` tokens.

Thread safety: every public method takes ``self.lock`` (re-entrant), so the stats and the operator
view can be read from another thread while the engine thread fetches and stores. No mx.eval runs
under the lock; :func:`kv.restore` only builds lazy slices.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from engine_worker.cache import kv
from engine_worker.cache.index import DEFAULT_INDEX_BLOCK, PrefixIndex
from engine_worker.cache.types import CacheHit, EntryInfo, MatchType, Tier


@dataclass(slots=True)
class Entry:
    key: str
    tokens: np.ndarray
    snap: kv.KVSnapshot
    hit_count: int = 0
    last_used: float = field(default_factory=time.time)
    promoted: bool = False  # came back from the SSD tier

    @property
    def nbytes(self) -> int:
        return self.snap.nbytes

    def info(self, tier: Tier = Tier.RAM) -> EntryInfo:
        return EntryInfo(
            key_hash=self.key,
            tokens=len(self.tokens),
            bytes=self.nbytes,
            tier=tier,
            hit_count=self.hit_count,
            last_used=self.last_used,
            quantized=self.snap.quantized,
        )


def classify(entry_len: int, lcp: int, prompt_len: int, trimmable: bool = True) -> tuple[MatchType, int]:
    """Match type and usable coverage for an entry sharing ``lcp`` tokens with the prompt.

    Coverage is capped at ``prompt_len - 1``: the engine must feed at least one prompt token to
    get the logits of the first new token (the seed's defects 10-11 came from getting this wrong
    in two opposite ways). A non-trimmable entry serves only prompts that extend it whole.
    """
    covered = min(lcp, prompt_len - 1)
    if covered <= 0 or (not trimmable and covered != entry_len):
        return MatchType.MISS, 0
    if lcp == entry_len == prompt_len:
        return MatchType.EXACT, covered
    if lcp == entry_len:
        return MatchType.PREFIX, covered
    if lcp == prompt_len:
        return MatchType.SUPERSEQUENCE, covered
    return MatchType.LCP, covered


class EntryStore:
    """LRU entries bounded by ``max_bytes`` and/or ``max_entries`` (None = unbounded)."""

    def __init__(
        self,
        *,
        max_bytes: int | None = None,
        max_entries: int | None = None,
        index_block: int = DEFAULT_INDEX_BLOCK,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.lock = threading.RLock()
        self._entries: OrderedDict[str, Entry] = OrderedDict()  # LRU first
        self._index = PrefixIndex(index_block)
        self._bytes = 0

    @property
    def min_tokens(self) -> int:
        """Entries shorter than one index block can never be matched, so they are not stored."""
        return self._index.block_size

    @property
    def bytes_used(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: str) -> Entry | None:
        return self._entries.get(key)

    def entries(self) -> Iterator[Entry]:
        with self.lock:
            return iter(list(self._entries.values()))

    def lookup(self, tokens: np.ndarray) -> CacheHit:
        """Best hit for ``tokens`` (a miss when nothing shares a full index block)."""
        with self.lock:
            found = self._index.best_match(tokens)
            if found is None:
                return CacheHit.miss(tokens.tolist())
            key, lcp = found
            entry = self._entries[key]
            match_type, covered = classify(len(entry.tokens), lcp, len(tokens), entry.snap.trimmable)
            if not match_type.is_hit:
                return CacheHit.miss(tokens.tolist())
            entry.hit_count += 1
            entry.last_used = time.time()
            self._entries.move_to_end(key)
            cache = kv.restore(entry.snap, covered)
            if entry.promoted:
                match_type = MatchType.SSD_HIT
            return CacheHit(cache, tokens[covered:].tolist(), match_type, covered)

    def fits(self, nbytes: int) -> bool:
        return self.max_bytes is None or nbytes <= self.max_bytes

    def insert(self, entry: Entry, *, evict_prefixes: bool = True) -> list[Entry]:
        """Add ``entry`` (the caller checked :meth:`fits`); returns the entries evicted to make
        room, least recently used first, so the caller can spill them to disk."""
        with self.lock:
            existing = self._entries.get(entry.key)
            if existing is not None:
                existing.last_used = time.time()
                self._entries.move_to_end(entry.key)
                return []
            dropped: list[Entry] = []
            if evict_prefixes and entry.snap.trimmable:
                # A stored proper prefix of the new key is dominated by it: drop it now rather
                # than let it take budget until LRU gets to it. It is not spilled to disk. A
                # wrapped sliding window (not trimmable) serves only prompts extending it whole,
                # so it dominates nothing: e.g. the prompt-only snapshot stays next to the
                # prompt+output entry of the same request.
                for key in self._index.prefixes_of(entry.tokens):
                    self._drop(key)
            self._entries[entry.key] = entry
            self._index.add(entry.key, entry.tokens)
            self._bytes += entry.nbytes
            while self._over_budget() and len(self._entries) > 1:
                oldest = next(iter(self._entries))
                dropped.append(self._drop(oldest))
            return dropped

    def set_max_bytes(self, max_bytes: int) -> list[Entry]:
        """Change the byte limit; returns the entries evicted (LRU first) to fit under it, even
        the last one (a limit of 0 empties the store)."""
        with self.lock:
            self.max_bytes = max_bytes
            dropped: list[Entry] = []
            while self._entries and self._bytes > max_bytes:
                dropped.append(self._drop(next(iter(self._entries))))
            return dropped

    def _over_budget(self) -> bool:
        if self.max_entries is not None and len(self._entries) > self.max_entries:
            return True
        return self.max_bytes is not None and self._bytes > self.max_bytes

    def _drop(self, key: str) -> Entry:
        entry = self._entries.pop(key)
        self._index.remove(key)
        self._bytes -= entry.nbytes
        return entry

    def remove(self, key: str) -> Entry | None:
        with self.lock:
            return self._drop(key) if key in self._entries else None

    def clear(self) -> int:
        with self.lock:
            count = len(self._entries)
            self._entries.clear()
            self._index.clear()
            self._bytes = 0
            return count
