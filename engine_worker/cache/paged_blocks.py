"""The paged cache's block pool: fixed-size KV blocks, content-addressed and ref-counted.

A block holds ``block_size`` positions of every layer's keys and values. Its identity is the
chain hash of all tokens up to and including it (:func:`index.chain_hashes`), so two requests
whose prompts share a prefix share that prefix's blocks: a block is stored once however many
sequences contain it.

Two counts per block:
* ``ref_count``: running requests holding it (from fetch until their finish/abort). A block with
  ``ref_count > 0`` is never evicted.
* ``users``: stored sequences containing it; ``users >= 2`` is a *shared* block in the stats.

When the pool is full, the least recently used unreferenced block is evicted, deeper blocks
first on ties (a child is useless without its parent, never the other way round).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

# Per layer, the block's (keys, values): mlx arrays cut from a request's cache (paged_cache.py).
LayerArrays = tuple[tuple[Any, Any], ...]


@dataclass(slots=True)
class Block:
    block_id: int
    chain_hash: int
    depth: int
    layers: LayerArrays
    ref_count: int = 0
    users: int = 0
    last_used: float = field(default_factory=time.monotonic)

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


@dataclass(frozen=True, slots=True)
class BlockTable:
    """The blocks covering a prompt's first ``num_tokens`` tokens, in order."""

    block_ids: tuple[int, ...]
    num_tokens: int


class PagedCacheManager:
    def __init__(self, block_size: int = 64, max_blocks: int = 1000) -> None:
        if block_size <= 0 or max_blocks <= 0:
            raise ValueError("block_size and max_blocks must be > 0")
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.lock = threading.RLock()
        self._blocks: dict[int, Block] = {}
        self._by_hash: dict[int, int] = {}
        self._free: list[int] = list(range(max_blocks - 1, -1, -1))
        self.evictions = 0
        self.dedup_hits = 0  # stores that found the block already present

    def lookup(self, chain_hash: int) -> Block | None:
        with self.lock:
            block_id = self._by_hash.get(chain_hash)
            return None if block_id is None else self._blocks[block_id]

    def block(self, block_id: int) -> Block:
        return self._blocks[block_id]

    def acquire(self, block_ids: tuple[int, ...] | list[int]) -> None:
        with self.lock:
            now = time.monotonic()
            for block_id in block_ids:
                block = self._blocks[block_id]
                block.ref_count += 1
                block.last_used = now

    def release(self, block_ids: tuple[int, ...] | list[int]) -> None:
        with self.lock:
            for block_id in block_ids:
                block = self._blocks.get(block_id)
                if block is not None and block.ref_count > 0:
                    block.ref_count -= 1

    def add(self, chain_hash: int, depth: int, layers: LayerArrays) -> int | None:
        """Store a block (or find it stored): returns its id, or None when the pool is full of
        blocks in use. Counts one more ``user`` either way."""
        with self.lock:
            existing = self._by_hash.get(chain_hash)
            if existing is not None:
                block = self._blocks[existing]
                block.users += 1
                block.last_used = time.monotonic()
                self.dedup_hits += 1
                return existing
            if not self._free and not self._evict_one():
                return None
            block_id = self._free.pop()
            self._blocks[block_id] = Block(block_id, chain_hash, depth, layers, users=1)
            self._by_hash[chain_hash] = block_id
            return block_id

    def contains_hash(self, chain_hash: int) -> bool:
        with self.lock:
            return chain_hash in self._by_hash

    def _evict_one(self) -> bool:
        victims = [b for b in self._blocks.values() if b.ref_count == 0]
        if not victims:
            return False
        victim = min(victims, key=lambda b: (b.last_used, -b.depth))
        self._remove(victim)
        self.evictions += 1
        return True

    def _remove(self, block: Block) -> None:
        del self._blocks[block.block_id]
        del self._by_hash[block.chain_hash]
        self._free.append(block.block_id)

    def evict(self, block_id: int) -> bool:
        """Drop one block unless a running request holds it."""
        with self.lock:
            block = self._blocks.get(block_id)
            if block is None or block.ref_count > 0:
                return False
            self._remove(block)
            return True

    def clear(self) -> int:
        """Drop every block not held by a running request; returns how many were dropped."""
        with self.lock:
            idle = [b for b in self._blocks.values() if b.ref_count == 0]
            for block in idle:
                self._remove(block)
            return len(idle)

    def blocks(self) -> list[Block]:
        with self.lock:
            return list(self._blocks.values())

    def get_stats(self) -> dict[str, Any]:
        with self.lock:
            blocks = list(self._blocks.values())
            return {
                "block_size": self.block_size,
                "max_blocks": self.max_blocks,
                "allocated_blocks": len(blocks),
                "free_blocks": len(self._free),
                "blocks_in_use": sum(1 for b in blocks if b.ref_count > 0),
                "shared_blocks": sum(1 for b in blocks if b.users >= 2 or b.ref_count >= 2),
                "bytes_used": sum(b.nbytes for b in blocks),
                "evictions": self.evictions,
                "dedup_hits": self.dedup_hits,
            }
