"""The paged back end (shared ref-counted blocks) and the legacy entry-count back end."""

from __future__ import annotations

from engine_worker.cache import BlockAwarePrefixCache, PagedCacheManager, PrefixCacheManager


def _paged(model, block_size: int = 16, max_blocks: int = 64) -> BlockAwarePrefixCache:
    return BlockAwarePrefixCache(model, PagedCacheManager(block_size=block_size, max_blocks=max_blocks))


def test_paged_hit_reuses_whole_blocks_and_generates_the_cold_tokens(tiny_model, prompts, prefill, greedy):
    paged = _paged(tiny_model[0])
    system = prompts(40)
    first = system + prompts(10, variant=3)
    paged.store_cache("r1", first, prefill(first))
    prompt = system + prompts(12, variant=7)

    table, remaining = paged.fetch_cache("r2", prompt)
    layers = paged.reconstruct_cache(table)

    assert table.num_tokens == 32  # two whole 16-token blocks of the 40 shared tokens
    assert remaining == prompt[32:]
    assert greedy(remaining, layers) == greedy(prompt)


def test_requests_sharing_a_prefix_share_its_blocks(tiny_model, prompts, prefill):
    paged = _paged(tiny_model[0])
    system = prompts(48)  # three blocks
    for i in range(4):
        tokens = system + prompts(16, variant=10 + i)
        paged.store_cache(f"r{i}", tokens, prefill(tokens))
    stats = paged.get_stats()
    assert stats["allocated_blocks"] == 3 + 4  # shared system blocks stored once
    assert stats["shared_blocks"] == 3
    assert stats["dedup_hits"] == 3 * 3

    for i in range(3):  # three running requests hold the system blocks at once
        paged.fetch_cache(f"live{i}", system + prompts(5, variant=30 + i))
    assert paged.get_stats()["blocks_in_use"] == 3


def test_full_pool_evicts_unused_blocks_but_never_a_block_in_use(tiny_model, prompts, prefill):
    paged = _paged(tiny_model[0], max_blocks=4)
    held = prompts(33, variant=1)  # two blocks, then held by a running request
    paged.store_cache(None, held, prefill(held))
    table, _ = paged.fetch_cache("running", held)
    assert len(table.block_ids) == 2

    for v in range(2, 6):
        tokens = prompts(32, variant=v)
        paged.store_cache(None, tokens, prefill(tokens))

    stats = paged.get_stats()
    assert stats["evictions"] > 0 and stats["allocated_blocks"] <= 4
    assert paged.fetch_cache("again", held)[0].block_ids == table.block_ids

    paged.release("running")
    paged.release("again")
    for v in range(6, 9):
        tokens = prompts(32, variant=v)
        paged.store_cache(None, tokens, prefill(tokens))
    assert paged.fetch_cache("late", held)[0].num_tokens == 0  # released, so evictable


def test_paged_protocol_fetch_leaves_no_references_behind(tiny_model, prompts, prefill):
    paged = _paged(tiny_model[0])
    tokens = prompts(40)
    paged.store(tokens, prefill(tokens))
    layers, remaining, hit_type = paged.fetch(tokens)
    assert hit_type == "hit" and layers[0].offset == 32 and remaining == tokens[32:]
    assert paged.get_stats()["blocks_in_use"] == 0


def test_legacy_cache_keeps_at_most_prefix_cache_size_entries(tiny_model, prompts, prefill, greedy):
    legacy = PrefixCacheManager(tiny_model[0], max_entries=2)
    stored = [prompts(40, variant=v) for v in (1, 2, 3)]
    for tokens in stored:
        legacy.store_cache(tokens, prefill(tokens))
    assert len(legacy) == 2 and legacy.get_stats()["evictions"] == 1
    assert legacy.fetch_cache(stored[0] + [9])[0] is None

    prompt = stored[2] + prompts(5, variant=8)
    layers, remaining = legacy.fetch_cache(prompt)
    assert len(remaining) == 5
    assert greedy(remaining, layers) == greedy(prompt)


def test_paged_operator_view_lists_blocks_and_never_evicts_one_in_use(tiny_model, prompts, prefill):
    paged = _paged(tiny_model[0])
    tokens = prompts(40)
    paged.store(tokens, prefill(tokens))
    rows = paged.list_entries()
    assert len(rows) == 2 and {r["tokens"] for r in rows} == {16}
    table, _ = paged.fetch_cache("running", tokens)
    assert paged.evict(str(table.block_ids[0])) is False
    paged.release("running")
    assert paged.evict(str(table.block_ids[0])) is True
    assert len(paged.list_entries()) == 1
