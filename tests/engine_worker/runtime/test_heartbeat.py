"""build_heartbeat: the prefix cache's most recently used entries, bounded, and the engine's
generated-token counter."""

from __future__ import annotations

from engine_worker.protocol import WorkerHeartbeat, from_dict, to_dict
from engine_worker.runtime.heartbeat import HEARTBEAT_CACHE_ENTRIES, build_heartbeat

MEMORY = {"device": "cpu", "active_bytes": 10, "peak_bytes": 20, "cache_bytes": 5, "limit_bytes": 1 << 30}


def entry(i: int) -> dict:
    return {"key_hash": f"{i:024x}", "tokens": 64 + i, "bytes": 4096 * i, "tier": "ram", "hit_count": i % 3,
            "last_used": 1_000.0 + (i * 37) % 101, "quantized": False}


def test_heartbeat_keeps_the_fifty_most_recently_used_entries_most_recent_first():
    rows = [entry(i) for i in range(101)]
    beat = build_heartbeat(worker_id="w", model="tiny", stats={"memory": MEMORY}, cache={"entries": 101},
                           cache_entries=rows)
    assert len(beat.cache_entries) == HEARTBEAT_CACHE_ENTRIES == 50
    kept = [row["last_used"] for row in beat.cache_entries]
    assert kept == sorted(kept, reverse=True)
    assert min(kept) >= sorted((row["last_used"] for row in rows), reverse=True)[49]
    assert beat.cache == {"entries": 101}  # the stats still count them all


def test_heartbeat_carries_the_generated_token_counter_and_the_memory_limit_through_json():
    beat = build_heartbeat(worker_id="w", model="tiny", cache=None,
                           stats={"memory": MEMORY, "counters": {"total_generated_tokens": 1234}},
                           cache_entries=[entry(1)])
    data = to_dict(beat)
    back = from_dict(WorkerHeartbeat, {**data, "memory": beat.memory})
    assert (back.generated_tokens, back.memory.limit_bytes) == (1234, 1 << 30)
    assert back.cache_entries == (entry(1),)


def test_a_heartbeat_without_the_new_fields_still_reads():
    beat = build_heartbeat(worker_id="w", model="tiny", stats={"memory": MEMORY}, cache=None)
    old = {k: v for k, v in to_dict(beat).items() if k not in ("cache_entries", "generated_tokens")}
    back = from_dict(WorkerHeartbeat, {**old, "memory": beat.memory})
    assert (back.cache_entries, back.generated_tokens) == ((), 0)
