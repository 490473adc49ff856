"""Storing many caches at once (``PrefixCacheBackend.store_many``, a step's finished requests): one
device sync for all their copies, and the same entries as storing them one by one."""

from __future__ import annotations

import pytest

from engine_worker.cache import (
    BlockAwarePrefixCache,
    MemoryAwarePrefixCache,
    MemoryCacheConfig,
    PagedCacheManager,
    PrefixCacheManager,
)
from engine_worker.cache.protocol import StoreItem
from engine_worker.cache.types import key_hash

BACKENDS = {
    "memory": lambda model: MemoryAwarePrefixCache(model, MemoryCacheConfig(max_memory_mb=64)),
    "quantized": lambda model: MemoryAwarePrefixCache(model, MemoryCacheConfig(
        max_memory_mb=64, kv_quantize=True, kv_group_size=64, kv_min_quantize_tokens=16)),
    "legacy": lambda model: PrefixCacheManager(model, max_entries=16),
    "paged": lambda model: BlockAwarePrefixCache(model, PagedCacheManager(block_size=16, max_blocks=64)),
}


@pytest.mark.parametrize("name", list(BACKENDS))
def test_store_many_copies_every_cache_in_one_sync(tiny_model, prompts, prefill, greedy, store_evals, name):
    backend = BACKENDS[name](tiny_model[0])
    stored = [prompts(40, variant=v) for v in range(6)]
    items = [StoreItem(tokens, prefill(tokens)) for tokens in stored]
    store_evals.clear()

    backend.store_many(items)

    # One by one: one eval per cache (six), two with quantization (the copy, then its quantization).
    assert len(store_evals) == 1
    prompt = stored[3] + prompts(6, variant=9)
    cache, remaining, _ = backend.fetch(prompt)
    assert cache is not None
    assert len(prompt) - len(remaining) >= 32
    if name != "quantized":  # a quantized entry generates its own (close) tokens
        assert greedy(remaining, cache) == greedy(prompt)


def _memory_cache(model) -> MemoryAwarePrefixCache:
    # 4 KiB a token on the tiny model: five 40-token entries fit, a sixth evicts the oldest.
    return MemoryAwarePrefixCache(model, MemoryCacheConfig(max_memory_mb=0.8))


def test_store_many_leaves_the_entries_and_counts_of_one_by_one_stores(tiny_model, prompts, prefill):
    """Under budget pressure, with a duplicate, an entry a later one dominates, a stored entry that
    the batch evicts before it touches it again, and replaced turns."""
    model = tiny_model[0]
    short, old_turn = prompts(32, variant=1), prompts(40, variant=2)
    before = [short, old_turn, prompts(40, variant=3)]
    longer = short + prompts(8, variant=4)
    reply = prompts(40, variant=5)
    batch = [
        StoreItem(longer, prefill(longer)),  # drops `short`, a prefix of it
        StoreItem(short, prefill(short)),  # stored when staged, gone when committed: stored again
        StoreItem(reply, prefill(reply), replaces=key_hash(old_turn)),
        StoreItem(reply, prefill(reply)),  # the same key again: an LRU touch
        *(StoreItem(t, prefill(t)) for t in (prompts(40, variant=v) for v in (6, 7))),
    ]
    one_by_one, together = _memory_cache(model), _memory_cache(model)
    for cache in (one_by_one, together):
        for tokens in before:
            cache.store(tokens, prefill(tokens))

    for item in batch:
        one_by_one.store(item.tokens, item.cache_layers)
        if item.replaces is not None:
            one_by_one.replace_turn(item.replaces)
    together.store_many(batch)

    def state(cache: MemoryAwarePrefixCache) -> tuple:
        stats = cache.get_stats()
        counts = {k: stats[k] for k in ("stores", "evictions", "rejected", "entries", "bytes_used")}
        return [(e["key_hash"], e["tokens"]) for e in cache.list_entries()], counts

    entries, counts = state(one_by_one)
    assert state(together) == (entries, counts)
    keys = [key for key, _ in entries]
    assert key_hash(short) in keys and key_hash(longer) in keys and key_hash(old_turn) not in keys
    assert counts["evictions"] > 0  # the budget evicted during the batch


def test_store_many_of_one_prompts_replies_keeps_the_later_one(tiny_model, prompts, prefill):
    from engine_worker.cache.turns import TurnStore

    cache = _memory_cache(tiny_model[0])
    turns = TurnStore(cache)
    prompt = prompts(32, variant=1)
    first, second = prompt + prompts(8, variant=2), prompt + prompts(8, variant=3)

    turns.store_many([(prompt, first, prefill(first)), (prompt, second, prefill(second))])

    assert [e["key_hash"] for e in cache.list_entries()] == [key_hash(second)]
