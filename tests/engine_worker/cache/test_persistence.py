"""save_to_disk / load_from_disk: after a restart the cache is warm and hits with parity."""

from __future__ import annotations

from engine_worker.cache import MemoryAwarePrefixCache, MemoryCacheConfig


def test_saved_cache_is_warm_after_a_restart_and_hits_with_parity(tiny_model, prompts, prefill, greedy, tmp_path):
    model = tiny_model[0]
    before = MemoryAwarePrefixCache(model, MemoryCacheConfig(max_memory_mb=64, kv_quantize=True,
                                                             kv_min_quantize_tokens=1000))
    a, b = prompts(64, variant=1), prompts(80, variant=2)
    before.store(a, prefill(a))
    before.store(b, prefill(b))
    assert before.save_to_disk(str(tmp_path)) is True

    after = MemoryAwarePrefixCache(model, MemoryCacheConfig(max_memory_mb=64))
    assert after.load_from_disk(str(tmp_path)) == 2

    prompt = b + prompts(7, variant=5)
    layers, remaining, hit_type = after.fetch(prompt)
    assert hit_type == "prefix" and len(remaining) == 7
    assert greedy(remaining, layers) == greedy(prompt)


def test_quantized_entries_round_trip_quantized(tiny_model, prompts, prefill, tmp_path):
    model = tiny_model[0]
    config = MemoryCacheConfig(max_memory_mb=64, kv_quantize=True, kv_bits=4, kv_min_quantize_tokens=32)
    before = MemoryAwarePrefixCache(model, config)
    tokens = prompts(64)
    before.store(tokens, prefill(tokens))
    before.save_to_disk(str(tmp_path))
    after = MemoryAwarePrefixCache(model, MemoryCacheConfig(max_memory_mb=64))
    after.load_from_disk(str(tmp_path))
    assert after.get_stats()["quantized_entries"] == 1
    assert after.get_stats()["bytes_used"] == before.get_stats()["bytes_used"]


def test_a_corrupted_saved_file_is_skipped_not_fatal(tiny_model, prompts, prefill, tmp_path, caplog):
    model = tiny_model[0]
    before = MemoryAwarePrefixCache(model, MemoryCacheConfig(max_memory_mb=64))
    a, b = prompts(64, variant=1), prompts(64, variant=2)
    before.store(a, prefill(a))
    before.store(b, prefill(b))
    before.save_to_disk(str(tmp_path))
    victim = sorted(tmp_path.glob("*.safetensors"))[0]
    victim.write_bytes(victim.read_bytes()[:100])

    after = MemoryAwarePrefixCache(model, MemoryCacheConfig(max_memory_mb=64))
    assert after.load_from_disk(str(tmp_path)) == 1
    assert any("skipping" in r.getMessage() for r in caplog.records)


def test_loading_a_missing_directory_loads_nothing(tiny_model, tmp_path):
    cache = MemoryAwarePrefixCache(tiny_model[0], MemoryCacheConfig(max_memory_mb=64))
    assert cache.load_from_disk(str(tmp_path / "nothing")) == 0
