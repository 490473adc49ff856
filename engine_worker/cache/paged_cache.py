"""The paged back end (``use_paged_cache``): prompts are cached as chains of shared blocks.

Only whole blocks are cached, and only blocks inside the first ``len(prompt) - 1`` tokens are
served, so at least one prompt token is always left to feed. A hit rebuilds a fresh ``KVCache``
per layer by concatenating the blocks (the blocks themselves are never handed out).

Requests are tracked by id when the caller gives one (:meth:`fetch_cache`, :meth:`fetch_for`,
:meth:`store_cache`, :meth:`release`; the scheduler's seam calls :meth:`fetch_for` at admission
and :meth:`release` when the request finishes, fails or is aborted): the blocks a running request
was served stay referenced, so they cannot be evicted under it, until it finishes or is aborted.
Through the id-less protocol methods (:meth:`fetch`/:meth:`store`) references last only for the
duration of the call.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from typing import Any

from engine_worker.runner.mlx_core import mx

from mlx_lm.models.cache import KVCache

from engine_worker.cache import kv
from engine_worker.cache.index import as_token_array, chain_hashes
from engine_worker.cache.paged_blocks import BlockTable, PagedCacheManager
from engine_worker.cache.protocol import PrefixCacheBackend, StoreItem
from engine_worker.cache.types import NO_SSD_STATS, CacheCounters, EntryInfo, MatchType, Tier

logger = logging.getLogger(__name__)


class BlockAwarePrefixCache(PrefixCacheBackend):
    name = "paged_cache"
    active = True

    def __init__(self, model: Any, paged_cache_manager: PagedCacheManager) -> None:
        self.model = model
        self.manager = paged_cache_manager
        self._held: dict[str, list[int]] = {}  # request id -> block ids it references
        self._counters = CacheCounters()
        self._anonymous = itertools.count()

    @property
    def block_size(self) -> int:
        return self.manager.block_size

    # seed API ------------------------------------------------------------------------------------
    def fetch_cache(self, request_id: str, tokens: Sequence[int]) -> tuple[BlockTable, list[int]]:
        """The cached blocks of ``tokens[:-1]``, referenced on behalf of ``request_id``."""
        arr = as_token_array(tokens)
        ids: list[int] = []
        with self.manager.lock:
            for h in chain_hashes(arr[:-1], self.block_size):
                block = self.manager.lookup(h)
                if block is None:
                    break
                ids.append(block.block_id)
            self.manager.acquire(ids)
            self._held.setdefault(request_id, []).extend(ids)
            table = BlockTable(tuple(ids), len(ids) * self.block_size)
            match = MatchType.HIT if ids else MatchType.MISS
            self._counters.record(match, table.num_tokens)
        return table, arr[table.num_tokens :].tolist()

    def reconstruct_cache(self, block_table: BlockTable) -> list[Any] | None:
        """Fresh per-layer caches holding the table's tokens (None for an empty table)."""
        if not block_table.block_ids:
            return None
        with self.manager.lock:
            blocks = [self.manager.block(i) for i in block_table.block_ids]
        caches: list[Any] = []
        for layer in range(len(blocks[0].layers)):
            keys = mx.concatenate([b.layers[layer][0] for b in blocks], axis=2)
            values = mx.concatenate([b.layers[layer][1] for b in blocks], axis=2)
            cache = KVCache()
            cache.state = (keys, values, block_table.num_tokens)
            caches.append(cache)
        return caches

    def store_cache(self, request_id: str | None, tokens: Sequence[int], cache_layers: list[Any]) -> int:
        """Store the whole blocks of ``cache_layers`` (blocks already present are shared, not
        copied), then release ``request_id``'s references. Returns the blocks added."""
        pending: list[Any] = []
        try:
            added = self._store_blocks(tokens, cache_layers, pending)
            if pending:
                mx.eval(pending)
            return added
        finally:
            if request_id is not None:
                self.release(request_id)

    def store_many(self, items: Sequence[StoreItem]) -> None:
        """Store each item's whole blocks, in order, the new blocks' copies evaluated in one
        ``mx.eval``. A prompt's replies share its blocks: nothing is replaced."""
        pending: list[Any] = []
        for item in items:
            self._store_blocks(item.tokens, item.cache_layers, pending)
        if pending:
            mx.eval(pending)

    def _store_blocks(self, tokens: Sequence[int], cache_layers: list[Any], pending: list[Any]) -> int:
        """Add the whole blocks of ``cache_layers`` (their copies lazy: appended to ``pending``,
        for the caller to evaluate); returns the blocks added."""
        if not cache_layers or not kv.is_sliceable(cache_layers):
            self._counters.rejected += 1
            return 0
        n = min(len(tokens), kv.cache_offset(cache_layers))
        arr = as_token_array(tokens[:n])
        bs = self.block_size
        added = 0
        pinned: list[int] = []
        # The lock keeps contains_hash + add atomic against evictions; pinning the chain while
        # it is stored keeps a full pool from evicting this sequence's own parent blocks.
        with self.manager.lock:
            for depth, h in enumerate(chain_hashes(arr, bs)):
                if self.manager.contains_hash(h):
                    block_id = self.manager.add(h, depth, ())  # one more user of a shared block
                    assert block_id is not None  # a stored block's id, under the lock
                    self.manager.acquire([block_id])
                    pinned.append(block_id)
                    continue
                start = depth * bs
                layers = tuple(
                    (mx.contiguous(c.keys[..., start : start + bs, :]),
                     mx.contiguous(c.values[..., start : start + bs, :]))
                    for c in cache_layers
                )
                block_id = self.manager.add(h, depth, layers)
                if block_id is None:
                    logger.debug("paged cache full of blocks in use; stored %d blocks", added)
                    break
                self.manager.acquire([block_id])
                pinned.append(block_id)
                pending.extend(a for pair in layers for a in pair)
                added += 1
            self.manager.release(pinned)
        self._counters.stores += 1
        return added

    def release(self, request_id: str) -> None:
        """Drop a finished or aborted request's block references."""
        with self.manager.lock:
            self.manager.release(self._held.pop(request_id, []))

    # protocol ------------------------------------------------------------------------------------
    def fetch(self, tokens: Sequence[int], request_id: str | None = None) -> tuple[list[Any] | None, list[int], str]:
        rid = request_id if request_id is not None else f"_anon{next(self._anonymous)}"
        table, remaining = self.fetch_cache(rid, tokens)
        try:
            cache = self.reconstruct_cache(table)
        finally:
            if request_id is None:
                self.release(rid)
        return cache, remaining, str(MatchType.HIT if cache is not None else MatchType.MISS)

    def fetch_for(self, request_id: str, tokens: Sequence[int]) -> tuple[list[Any] | None, list[int], str]:
        """:meth:`fetch` on behalf of a request: the blocks served stay referenced (never
        evicted) until :meth:`release` of ``request_id``."""
        return self.fetch(tokens, request_id=request_id)

    def store(self, tokens: Sequence[int], cache_layers: list[Any], request_id: str | None = None) -> None:
        self.store_cache(request_id, tokens, cache_layers)

    def clear(self) -> None:
        self.manager.clear()

    def list_entries(self) -> list[dict[str, Any]]:
        """One row per block (the paged cache's unit of storage); ``hit_count`` is the number of
        stored sequences sharing the block, ``key_hash`` its id for :meth:`evict`."""
        now_wall, now_mono = time.time(), time.monotonic()
        return [
            EntryInfo(str(b.block_id), self.block_size, b.nbytes, Tier.PAGED, b.users,
                      now_wall - (now_mono - b.last_used), False).as_dict()
            for b in self.manager.blocks()
        ]

    def evict(self, key: str) -> bool:
        """Drop one block by id, unless a running request holds it."""
        return key.isdigit() and self.manager.evict(int(key))

    def get_stats(self) -> dict[str, Any]:
        with self.manager.lock:
            return {
                "backend": "paged",
                **self._counters.as_dict(),
                **self.manager.get_stats(),
                "requests_holding_blocks": len(self._held),
                "entries": self.manager.get_stats()["allocated_blocks"],
                "bytes_limit": None,  # bounded by max_blocks, not bytes
                "quantized_entries": 0,
                **NO_SSD_STATS,
            }
