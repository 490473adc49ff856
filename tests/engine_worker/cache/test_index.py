"""The prefix index when many entries share one prefix (a chat template, a system prompt)."""

from __future__ import annotations

import time

import numpy as np

from engine_worker.cache.index import MAX_CANDIDATES, PrefixIndex

TEMPLATE = np.arange(1000, 1032, dtype=np.int64)  # two full blocks every entry shares


def _filled(n: int, seed: int = 0) -> PrefixIndex:
    rng = np.random.default_rng(seed)
    index = PrefixIndex()
    for i in range(n):
        index.add(f"e{i}", np.concatenate([TEMPLATE, rng.integers(0, 900, 8)]))
    return index


def _lookups_s(index: PrefixIndex, rng: np.random.Generator) -> float:
    prompts = [np.concatenate([TEMPLATE, rng.integers(0, 900, 9)]) for _ in range(50)]
    start = time.perf_counter()
    for prompt in prompts:
        assert index.best_match(prompt)[1] >= len(TEMPLATE)
        index.prefixes_of(prompt)
    return time.perf_counter() - start


def test_lookup_cost_does_not_grow_with_entries_behind_one_prefix():
    rng = np.random.default_rng(1)
    small, large = _filled(MAX_CANDIDATES), _filled(50 * MAX_CANDIDATES)
    _lookups_s(small, rng)  # warm
    few = min(_lookups_s(small, rng) for _ in range(3))
    many = min(_lookups_s(large, rng) for _ in range(3))
    # Scanning every candidate made this about 50x; bounded, it stays near 1x.
    assert many < 8 * few, (many, few)


def test_whole_prefix_entry_found_among_many_sharing_its_block():
    index = _filled(10 * MAX_CANDIDATES)
    mine = np.concatenate([TEMPLATE, np.array([901, 902, 903], dtype=np.int64)])
    index.add("mine", mine)
    prompt = np.concatenate([mine, np.array([7, 8, 9], dtype=np.int64)])
    assert index.best_match(prompt) == ("mine", len(mine))
    assert index.prefixes_of(prompt) == ["mine"]
    index.remove("mine")
    assert index.prefixes_of(prompt) == []
