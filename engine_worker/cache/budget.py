"""How many bytes the prefix cache may hold: ``cache_memory_mb``, or ``cache_memory_percent`` of
the memory it is carved out of (the worker's budget in the engine; the device's memory for a
cache built on its own)."""

from __future__ import annotations

MB = 1024 * 1024


def resolve_budget_bytes(max_memory_mb: float | None, max_memory_percent: float,
                         total_bytes: int | None = None) -> int:
    """The byte budget: an explicit ``max_memory_mb`` wins; otherwise ``max_memory_percent`` (a
    fraction in (0, 1]) of ``total_bytes``, by default of :func:`engine_worker.runner.device_memory.device_memory_bytes`."""
    if max_memory_mb is not None:
        if max_memory_mb < 0:
            raise ValueError("cache_memory_mb must be >= 0")
        return int(max_memory_mb * MB)
    if not 0.0 < max_memory_percent <= 1.0:
        raise ValueError("cache_memory_percent must be in (0, 1]")
    if total_bytes is None:
        from engine_worker.runner.device_memory import device_memory_bytes

        total_bytes, _source = device_memory_bytes()
    return int(total_bytes * max_memory_percent)
