"""Worker heartbeats: identity, model, device, memory and what the engine is doing."""

from __future__ import annotations

import time
from typing import Any

from engine_worker.protocol import MemoryStats, WorkerHeartbeat, from_dict


def memory_stats(stats: dict[str, Any] | None = None) -> MemoryStats:
    """The ``memory`` section of ``EngineCore.get_stats()`` (mlx's allocator figures, the budget
    and its parts), or mlx's allocator figures alone when ``stats`` has none."""
    raw = (stats or {}).get("memory")
    if raw is None:
        from engine_worker import memory

        raw = memory.memory_stats()
    return from_dict(MemoryStats, {k: int(v) if k != "device" else v for k, v in raw.items()})


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
    memory = memory_stats(stats)
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
