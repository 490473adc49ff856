"""Worker heartbeats: identity, model, device, memory and what the engine is doing."""

from __future__ import annotations

import time
from typing import Any

from engine_worker.protocol import MemoryStats, WorkerHeartbeat


def memory_stats() -> MemoryStats:
    """mlx's allocator figures in bytes, labelled with the device they describe."""
    from engine_worker import memory

    raw = memory.memory_stats()
    return MemoryStats(
        device=raw["device"],
        active_bytes=raw["active_bytes"],
        peak_bytes=raw["peak_bytes"],
        cache_bytes=raw["cache_bytes"],
    )


def build_heartbeat(
    *,
    worker_id: str,
    model: str,
    stats: dict[str, Any],
    cache: dict[str, Any] | None,
    context_length: int | None = None,
) -> WorkerHeartbeat:
    """A heartbeat from ``EngineCore.get_stats()`` (``requests`` holds the scheduler's
    ``get_running_requests_info()`` rows) and ``get_cache_stats()``."""
    memory = memory_stats()
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
    )


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
