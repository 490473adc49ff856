"""The memory-aware back end on the real tiny model: hit parity, alignment, budget, operator view."""

from __future__ import annotations

import pytest

from engine_worker.cache import MemoryAwarePrefixCache, MemoryCacheConfig
from engine_worker.runner.device_memory import device_memory_bytes


@pytest.fixture
def cache(tiny_model) -> MemoryAwarePrefixCache:
    return MemoryAwarePrefixCache(tiny_model[0], MemoryCacheConfig(max_memory_mb=64))


def _assert_aligned(prompt, cache_layers, remaining):
    assert remaining, "at least one prompt token must be left to feed"
    assert prompt[len(prompt) - len(remaining):] == remaining
    assert all(c.offset == len(prompt) - len(remaining) for c in cache_layers)


@pytest.mark.parametrize(
    "case, expected_type",
    [
        ("exact", "exact"),
        ("shared_prefix", "lcp"),
        ("multi_turn", "prefix"),
        ("prompt_is_prefix_of_entry", "supersequence"),
    ],
)
def test_hit_generates_exactly_the_cold_greedy_tokens(cache, prompts, prefill, greedy, case, expected_type):
    first = prompts(60)
    first_output = greedy(first)
    entry_tokens = first + first_output  # what the scheduler stores on finish
    assert cache.store(entry_tokens, prefill(entry_tokens))
    prompt = {
        "exact": entry_tokens,
        "shared_prefix": first[:40] + prompts(12, variant=3),
        "multi_turn": entry_tokens + prompts(9, variant=5),
        "prompt_is_prefix_of_entry": first[:50],
    }[case]

    layers, remaining, hit_type = cache.fetch(prompt)

    assert hit_type == expected_type
    _assert_aligned(prompt, layers, remaining)
    assert greedy(remaining, layers) == greedy(prompt)


def test_a_miss_returns_no_cache_and_the_whole_prompt(cache, prompts, prefill):
    stored = prompts(40)
    cache.store(stored, prefill(stored))
    prompt = prompts(40, variant=2)
    assert cache.fetch(prompt) == (None, prompt, "miss")
    assert cache.get_stats()["misses"] == 1


def test_fetched_cache_is_a_copy_that_generation_cannot_corrupt(cache, prompts, prefill, greedy):
    entry = prompts(48)
    cache.store(entry, prefill(entry))
    prompt = entry + prompts(6, variant=4)
    reference = greedy(prompt)
    for _ in range(2):  # the second hit must see the entry unchanged by the first generation
        layers, remaining, _ = cache.fetch(prompt)
        assert greedy(remaining, layers, max_tokens=10) == reference


def test_key_is_cut_to_what_the_cache_actually_holds(cache, prompts, prefill):
    tokens = prompts(50)
    cache.store(tokens + [7, 8, 9], prefill(tokens))  # 3 tokens the cache never saw
    [row] = cache.list_entries()
    assert row["tokens"] == 50


def test_budget_is_never_exceeded_and_lru_entries_go_first(tiny_model, prompts, prefill):
    probe = MemoryAwarePrefixCache(tiny_model[0], MemoryCacheConfig(max_memory_mb=64))
    probe.store(prompts(64), prefill(prompts(64)))
    entry_bytes = probe.get_stats()["bytes_used"]
    small = MemoryAwarePrefixCache(tiny_model[0], MemoryCacheConfig(max_memory_mb=2.5 * entry_bytes / 2**20))
    a, b, c = (prompts(64, variant=v) for v in (1, 2, 3))
    small.store(a, prefill(a))
    small.store(b, prefill(b))
    small.fetch(a + [5])  # a is now more recent than b
    small.store(c, prefill(c))

    stats = small.get_stats()
    assert stats["bytes_used"] <= stats["bytes_limit"]
    assert stats["entries"] == 2 and stats["evictions"] == 1
    assert small.fetch(b + [5])[2] == "miss"
    assert small.fetch(a + [5])[2] == "prefix"


def test_an_entry_larger_than_the_budget_is_refused(tiny_model, prompts, prefill):
    tiny = MemoryAwarePrefixCache(tiny_model[0], MemoryCacheConfig(max_memory_mb=0.01))
    tokens = prompts(64)
    assert tiny.store(tokens, prefill(tokens)) is False
    stats = tiny.get_stats()
    assert (stats["entries"], stats["bytes_used"], stats["rejected"]) == (0, 0, 1)


def _wrapped_window(model, tokens):
    import mlx.core as mx
    from mlx_lm.models.cache import RotatingKVCache

    window = [RotatingKVCache(max_size=32, keep=4) for _ in model.layers]
    model(mx.array([tokens]), cache=window)
    mx.eval([c.keys for c in window])
    return window


def test_a_wrapped_sliding_window_is_stored_whole_and_serves_only_extending_prompts(
        cache, tiny_model, prompts, greedy, tmp_path):
    import copy

    model, _ = tiny_model
    tokens = prompts(48)
    window = _wrapped_window(model, tokens)
    assert not window[0].is_trimmable()
    pristine = copy.deepcopy(window)  # generation advances a cache in place: copy per use
    assert cache.store(tokens, window) is True

    next_turn = tokens + prompts(6, variant=7)
    layers, remaining, hit_type = cache.fetch(next_turn)
    assert (hit_type, remaining) == ("prefix", next_turn[48:])
    assert type(layers[0]).__name__ == "RotatingKVCache" and layers[0].offset == 48
    expected = greedy(remaining, copy.deepcopy(pristine))
    assert greedy(remaining, layers) == expected  # continues the live window exactly
    for shorter in (tokens, tokens[:40]):  # would need trimming: a miss, never a wrong cache
        assert cache.fetch(shorter)[2] == "miss"

    cache.save_to_disk(str(tmp_path))  # the window's rotation state survives persistence
    cache.clear()
    assert cache.load_from_disk(str(tmp_path)) == 1
    layers, remaining, _ = cache.fetch(next_turn)
    assert greedy(remaining, layers) == expected


def test_a_wrapped_window_cut_short_is_refused(cache, tiny_model, prompts):
    model, _ = tiny_model
    tokens = prompts(48)
    assert cache.store(tokens[:40], _wrapped_window(model, tokens)) is False  # key shorter than it holds
    assert cache.get_stats()["rejected"] == 1


def test_storing_an_extension_drops_the_dominated_prefix_entry(cache, prompts, prefill):
    prompt = prompts(40)
    cache.store(prompt[:32], prefill(prompt[:32]))  # e.g. a mid-prefill save
    cache.store(prompt, prefill(prompt))
    assert [row["tokens"] for row in cache.list_entries()] == [40]


def test_partial_prefill_entry_serves_the_full_prompt(cache, prompts, prefill, greedy):
    prompt = prompts(64)
    cache.store(prompt[:32], prefill(prompt[:32]))  # what a mid-prefill save stores
    layers, remaining, hit_type = cache.fetch(prompt)
    assert (hit_type, len(remaining)) == ("prefix", 32)
    assert greedy(remaining, layers) == greedy(prompt)


def test_operator_view_lists_evicts_and_clears(cache, prompts, prefill):
    a, b = prompts(40, variant=1), prompts(40, variant=2)
    cache.store(a, prefill(a))
    cache.store(b, prefill(b))
    cache.fetch(a + [3])
    rows = {row["tokens"]: row for row in cache.list_entries()}
    assert set(rows[40]) == {"key_hash", "tokens", "bytes", "tier", "hit_count", "last_used", "quantized"}
    by_hits = sorted(cache.list_entries(), key=lambda r: r["hit_count"])
    assert [r["hit_count"] for r in by_hits] == [0, 1]
    assert cache.evict(by_hits[0]["key_hash"]) is True
    assert cache.get_stats()["entries"] == 1
    cache.clear()
    stats = cache.get_stats()
    assert (stats["entries"], stats["bytes_used"]) == (0, 0)
    for key in ("hits", "misses", "hit_rate", "bytes_limit", "evictions", "quantized_entries",
                "ssd_entries", "ssd_bytes", "ssd_hits", "promotions", "failures"):
        assert key in stats


def test_percent_budget_is_a_fraction_of_device_memory(tiny_model):
    total, _label = device_memory_bytes()
    pc = MemoryAwarePrefixCache(tiny_model[0], MemoryCacheConfig(max_memory_percent=0.1))
    assert pc.get_stats()["bytes_limit"] == int(total * 0.1)


def test_stats_and_listing_are_safe_to_read_while_the_engine_stores(cache, prompts, prefill):
    import threading

    stop = threading.Event()
    errors: list[BaseException] = []

    def operator_view():
        while not stop.is_set():
            try:
                stats = cache.get_stats()
                assert stats["bytes_used"] <= stats["bytes_limit"]
                cache.list_entries()
            except BaseException as exc:  # surfaced below: a failing reader must fail the test
                errors.append(exc)
                return

    reader = threading.Thread(target=operator_view)
    reader.start()
    try:
        for v in range(12):
            tokens = prompts(40, variant=v)
            cache.store(tokens, prefill(tokens))
            cache.fetch(tokens + [1])
    finally:
        stop.set()
        reader.join()
    assert not errors
    assert cache.get_stats()["entries"] == 12
