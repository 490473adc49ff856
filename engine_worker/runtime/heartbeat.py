"""Worker heartbeats: identity, model, device, memory and what the engine is doing."""

from __future__ import annotations

import heapq
import time
from typing import Any

from engine_worker.protocol import MemoryStats, WorkerHeartbeat, from_dict

# A heartbeat carries the prefix cache's entries most recently used, not all of them: a cache can
# hold thousands (a paged cache lists every block), and the heartbeat is rewritten every couple of
# seconds and read by every dashboard poll. Fifty rows are what an operator scans on one screen;
# the cache's stats still count every entry.
HEARTBEAT_CACHE_ENTRIES = 50


def memory_stats(stats: dict[str, Any] | None = None) -> MemoryStats:
    """The ``memory`` section of ``EngineCore.get_stats()`` (mlx's allocator figures, the budget
    and its parts), or mlx's allocator figures alone when ``stats`` has none."""
    raw = (stats or {}).get("memory")
    if raw is None:
        from engine_worker.runner import device_memory

        raw = device_memory.memory_stats()
    return from_dict(MemoryStats, {k: int(v) if k != "device" else v for k, v in raw.items()})


def build_heartbeat(
    *,
    worker_id: str,
    model: str,
    stats: dict[str, Any],
    cache: dict[str, Any] | None,
    context_length: int | None = None,
    cache_entries: list[dict[str, Any]] | None = None,
) -> WorkerHeartbeat:
    """A heartbeat from ``EngineCore.get_stats()`` (``requests`` holds the scheduler's
    ``get_running_requests_info()`` rows), ``get_cache_stats()`` and ``list_cache_entries()``
    (of which the :data:`HEARTBEAT_CACHE_ENTRIES` most recently used are kept)."""
    memory = memory_stats(stats)
    counters = stats.get("counters") or {}
    return WorkerHeartbeat(
        worker_id=worker_id,
        model=model,
        device=memory.device,
        memory=memory,
        num_running=int(stats.get("num_running", 0)),
        num_waiting=int(stats.get("num_waiting", 0)),
        sent_at=time.time(),
        requests=tuple(_jsonable(row) for row in stats.get("requests", ()) or ()),
        cache=_jsonable(cache) if cache else None,
        context_length=context_length,
        cache_entries=tuple(_jsonable(row) for row in recent_entries(cache_entries or [])),
        generated_tokens=int(counters.get("total_generated_tokens", 0)),
        capacity=int(stats.get("max_running", 0)),
    )


def recent_entries(rows: list[dict[str, Any]], limit: int = HEARTBEAT_CACHE_ENTRIES) -> list[dict[str, Any]]:
    """The ``limit`` rows most recently used, most recent first."""
    return heapq.nlargest(limit, rows, key=lambda row: float(row.get("last_used") or 0.0))


def _jsonable(value: Any) -> Any:
    """Plain JSON types only (stats may hold numpy scalars, tuples or enums)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "item"):
        return value.item()
    return str(value)
