"""Plain types shared by the prefix-cache back ends: match kinds, fetch results, entry rows, errors.

No mlx import here: the scheduler, the admin dashboard and the tests can read these without
touching the accelerator.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class MatchType(StrEnum):
    """How a prompt matched a stored entry (the seed's ``cache_hit_type`` values)."""

    EXACT = "exact"  # the entry's tokens equal the prompt
    PREFIX = "prefix"  # the entry is a proper prefix of the prompt
    SUPERSEQUENCE = "supersequence"  # the prompt is a proper prefix of the entry (prompt+output)
    LCP = "lcp"  # the prompt and the entry diverge; the common prefix is reused
    HIT = "hit"  # paged / legacy back ends: some prefix blocks were reused
    SSD_PENDING = "ssd_pending"  # a disk entry matches; it is being read in the background
    SSD_HIT = "ssd_hit"  # served from an entry promoted from disk
    MISS = "miss"

    @property
    def is_hit(self) -> bool:
        return self not in (MatchType.MISS, MatchType.SSD_PENDING)


class Tier(StrEnum):
    RAM = "ram"  # the memory-aware (or legacy) cache's entries in device memory
    PAGED = "paged"  # the paged cache's blocks, in device memory
    SSD = "ssd"


@dataclass(frozen=True, slots=True)
class CacheHit:
    """The result of a lookup.

    Invariant (the fix for the seed's alignment defects 10-11): ``cache`` covers exactly
    ``cached_tokens`` tokens, ``cached_tokens <= len(prompt) - 1`` and ``remaining`` is the
    non-empty uncovered suffix, so the engine always feeds at least one token and gets logits for
    the next one. ``cache`` is a fresh list of fresh cache objects the caller owns.
    """

    cache: list[Any] | None
    remaining: list[int]
    match_type: MatchType
    cached_tokens: int = 0

    @classmethod
    def miss(cls, tokens: Sequence[int], match_type: MatchType = MatchType.MISS) -> CacheHit:
        return cls(cache=None, remaining=list(tokens), match_type=match_type, cached_tokens=0)

    def as_tuple(self) -> tuple[list[Any] | None, list[int], str]:
        """``(cache_layers | None, remaining_tokens, hit_type)``: the scheduler's seam."""
        return self.cache, self.remaining, str(self.match_type)


@dataclass(slots=True)
class EntryInfo:
    """One row of the operator view (``list_entries``)."""

    key_hash: str
    tokens: int
    bytes: int
    tier: Tier
    hit_count: int
    last_used: float
    quantized: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "key_hash": self.key_hash,
            "tokens": self.tokens,
            "bytes": self.bytes,
            "tier": str(self.tier),
            "hit_count": self.hit_count,
            "last_used": self.last_used,
            "quantized": self.quantized,
        }


@dataclass(slots=True)
class CacheCounters:
    """Monotonic counters; mutated under the owning cache's lock."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    stores: int = 0
    rejected: int = 0  # entries refused: larger than the budget, or not trimmable
    tokens_served: int = 0
    by_type: dict[str, int] = field(default_factory=dict)

    def record(self, match_type: MatchType, cached_tokens: int) -> None:
        self.by_type[str(match_type)] = self.by_type.get(str(match_type), 0) + 1
        if match_type.is_hit:
            self.hits += 1
            self.tokens_served += cached_tokens
        else:
            self.misses += 1

    def as_dict(self) -> dict[str, Any]:
        lookups = self.hits + self.misses
        return {
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": round(self.hits / lookups, 4) if lookups else 0.0,
            "evictions": self.evictions,
            "stores": self.stores,
            "rejected": self.rejected,
            "tokens_served": self.tokens_served,
            "hits_by_type": dict(self.by_type),
        }


# Keys every back end's get_stats() carries, so the dashboard needs no per-back-end cases; the
# tiers a back end lacks report zeros.
NO_SSD_STATS: dict[str, Any] = {"ssd_enabled": False, "ssd_entries": 0, "ssd_bytes": 0, "ssd_hits": 0,
                                "promotions": 0, "failures": 0}


def key_hash(tokens: Sequence[int]) -> str:
    """Stable short id of a token sequence (entry keys in stats, file names on disk)."""
    return hashlib.blake2b(array("q", tokens).tobytes(), digest_size=12).hexdigest()


class PrefixCacheError(Exception):
    """Base class of the cache package's errors."""


class CacheEntryCorrupt(PrefixCacheError):
    """A file on disk failed its checksum or could not be parsed (the entry is a miss)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"corrupt cache entry {path}: {reason}")
        self.path = path
        self.reason = reason


class UnsupportedCache(PrefixCacheError):
    """The layer cache type cannot be stored (e.g. a rotating cache that wrapped)."""

    def __init__(self, cache_type: str) -> None:
        super().__init__(f"cache type {cache_type} cannot be stored")
        self.cache_type = cache_type
