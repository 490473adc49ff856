"""The SSD tier: background spills, an index that survives restarts, background promotion with
parity, the size cap, and corrupted files treated as misses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine_worker.cache import MemoryAwarePrefixCache, MemoryCacheConfig, SSDCacheConfig, SSDCacheTier


def _entry_bytes(model, prompts, prefill) -> int:
    probe = MemoryAwarePrefixCache(model, MemoryCacheConfig(max_memory_mb=64))
    probe.store(prompts(64), prefill(prompts(64)))
    return probe.get_stats()["bytes_used"]


@pytest.fixture
def tiered(tiny_model, prompts, prefill, tmp_path):
    """A RAM budget of ~1.5 entries of 64 tokens over an SSD tier in tmp_path."""
    model = tiny_model[0]
    budget_mb = 1.5 * _entry_bytes(model, prompts, prefill) / 2**20
    tiers = []

    def make(max_gb: float = 1.0) -> MemoryAwarePrefixCache:
        tier = SSDCacheTier(SSDCacheConfig(cache_dir=str(tmp_path / "ssd"), max_size_gb=max_gb))
        tier.reconcile()
        tier.start_writer()
        tiers.append(tier)
        cache = MemoryAwarePrefixCache(model, MemoryCacheConfig(max_memory_mb=budget_mb))
        cache.set_ssd_tier(tier)
        return cache

    yield make
    for tier in tiers:
        tier.close()


def _promote(cache: MemoryAwarePrefixCache, prompt: list[int]) -> tuple:
    """First lookup queues the background read; wait for it off the 'engine' path, look again."""
    first = cache.fetch(prompt)
    assert first[2] == "ssd_pending" and first[0] is None
    assert cache.ssd_tier.flush(timeout=30)
    return cache.fetch(prompt)


def test_evicted_entry_is_written_by_the_background_writer_and_promoted_with_parity(
        tiered, prompts, prefill, greedy):
    cache = tiered()
    a, b = prompts(64, variant=1), prompts(64, variant=2)
    cache.store(a, prefill(a))
    cache.store(b, prefill(b))  # evicts a from RAM → queued for the writer
    assert cache.ssd_tier.flush(timeout=30)
    assert cache.get_stats()["ssd_entries"] == 1

    prompt = a + prompts(6, variant=9)
    layers, remaining, hit_type = _promote(cache, prompt)

    assert hit_type == "ssd_hit" and len(remaining) == 6
    assert greedy(remaining, layers) == greedy(prompt)
    stats = cache.get_stats()
    assert (stats["ssd_hits"], stats["promotions"], stats["failures"]) == (1, 1, 0)
    tiers = {row["tier"] for row in cache.list_entries()}
    assert tiers == {"ram", "ssd"}


def test_index_survives_a_restart_and_is_reconciled_with_the_files(tiered, prompts, prefill, greedy, tmp_path):
    cache = tiered()
    a, b, c = (prompts(64, variant=v) for v in (1, 2, 3))
    for tokens in (a, b, c):
        cache.store(tokens, prefill(tokens))
    assert cache.ssd_tier.flush(timeout=30)
    cache.ssd_tier.close()
    directory = tmp_path / "ssd"
    assert cache.get_stats()["ssd_entries"] == 2
    rows = json.loads((directory / "index.json").read_text())["rows"]
    gone = directory / rows[0]["file"]
    gone.unlink()  # lost behind our back
    (directory / "stray.safetensors").write_bytes(b"orphan")

    restarted = tiered()

    assert restarted.get_stats()["ssd_entries"] == 1
    assert not (directory / "stray.safetensors").exists()
    survivor = [r for r in rows if r["file"] != gone.name][0]["tokens"]
    prompt = survivor + prompts(5, variant=11)
    layers, remaining, hit_type = _promote(restarted, prompt)
    assert hit_type == "ssd_hit"
    assert greedy(remaining, layers) == greedy(prompt)


def test_size_cap_is_enforced_by_evicting_least_recent_files(tiered, prompts, prefill, tmp_path):
    cache = tiered(max_gb=1.0)
    cap = int(2.5 * _file_size_estimate(cache, prompts, prefill, tmp_path))
    cache.ssd_tier.max_bytes = cap
    for v in range(2, 8):
        tokens = prompts(64, variant=v)
        cache.store(tokens, prefill(tokens))
    assert cache.ssd_tier.flush(timeout=30)
    stats = cache.get_stats()["ssd"]
    assert stats["ssd_bytes"] <= cap
    assert stats["ssd_entries"] == 2 and stats["ssd_evictions"] >= 1
    on_disk = sum(p.stat().st_size for p in (tmp_path / "ssd").glob("*.safetensors"))
    assert on_disk == stats["ssd_bytes"]


def _file_size_estimate(cache, prompts, prefill, tmp_path) -> int:
    a, b = prompts(64, variant=40), prompts(64, variant=41)
    cache.store(a, prefill(a))
    cache.store(b, prefill(b))
    assert cache.ssd_tier.flush(timeout=30)
    size = cache.get_stats()["ssd_bytes"]
    cache.clear(include_ssd=True)
    return size


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_file_is_a_logged_miss_and_is_deleted(tiered, prompts, prefill, caplog, damage):
    cache = tiered()
    a, b = prompts(64, variant=1), prompts(64, variant=2)
    cache.store(a, prefill(a))
    cache.store(b, prefill(b))
    assert cache.ssd_tier.flush(timeout=30)
    [path] = Path(cache.ssd_tier.directory).glob("*.safetensors")
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(data[:-10] + bytes(b ^ 0xFF for b in data[-10:]))

    prompt = a + prompts(4, variant=9)
    assert cache.fetch(prompt)[2] == "ssd_pending"
    assert cache.ssd_tier.flush(timeout=30)
    layers, remaining, hit_type = cache.fetch(prompt)

    assert (layers, hit_type) == (None, "miss") and remaining == prompt
    assert not path.exists()
    stats = cache.get_stats()
    assert stats["failures"] == 1 and stats["ssd_entries"] == 0
    assert any("dropped" in r.getMessage() for r in caplog.records)


def test_disk_reads_never_run_on_the_calling_engine_thread(tiered, prompts, prefill, monkeypatch):
    import threading

    from engine_worker.cache import entry_io

    readers: list[str] = []
    real_read = entry_io.read_file

    def spy(*args, **kwargs):
        readers.append(threading.current_thread().name)
        return real_read(*args, **kwargs)

    monkeypatch.setattr(entry_io, "read_file", spy)
    cache = tiered()
    a, b = prompts(64, variant=1), prompts(64, variant=2)
    cache.store(a, prefill(a))
    cache.store(b, prefill(b))
    assert cache.ssd_tier.flush(timeout=30)
    _promote(cache, a + [5, 6])
    assert readers == ["ssd-cache-io"]
