"""Accelerator memory figures, in bytes, labelled with the device they describe.

Nothing here assumes Metal: the figures come from ``mx.get_active_memory()`` and friends, which
work on the CPU, CUDA and Metal builds alike (mlx-notes.md section 4e).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx


def device_label() -> str:
    """``"metal"``, ``"cuda"`` or ``"cpu"``: the device mlx computes on by default."""
    if mx.default_device().type == mx.DeviceType.gpu:
        if mx.metal.is_available():
            return "metal"
        if mx.cuda.is_available():
            return "cuda"
        return "gpu"
    return "cpu"


def memory_stats() -> dict[str, Any]:
    """``{"device", "active_bytes", "peak_bytes", "cache_bytes", "limit_bytes"}``."""
    return {
        "device": device_label(),
        "active_bytes": int(mx.get_active_memory()),
        "peak_bytes": int(mx.get_peak_memory()),
        "cache_bytes": int(mx.get_cache_memory()),
        "limit_bytes": int(mx.get_memory_limit()),
    }


def device_memory_bytes() -> int | None:
    """Total memory of the accelerator, or None where mlx does not report it (the CPU build)."""
    size = mx.device_info().get("memory_size")
    return int(size) if size else None


def apply_memory_fraction(fraction: float) -> int | None:
    """Cap mlx's memory use at ``fraction`` of the device's memory (``gpu_memory_utilization``).

    Beyond the limit mlx waits for running work to free memory before allocating more. Returns
    the limit set, or None when the device does not report its size (then mlx's own default,
    about 85 % of RAM on the CPU build, stays in force).
    """
    size = device_memory_bytes()
    if size is None:
        return None
    limit = int(size * fraction)
    mx.set_memory_limit(limit)
    return limit


def seed_memory_keys(stats: dict[str, Any]) -> dict[str, float]:
    """The seed's ``metal_*_memory_gb`` keys, which it reported only on Metal."""
    if stats["device"] != "metal":
        return {}
    return {
        "metal_active_memory_gb": round(stats["active_bytes"] / 1e9, 2),
        "metal_peak_memory_gb": round(stats["peak_bytes"] / 1e9, 2),
        "metal_cache_memory_gb": round(stats["cache_bytes"] / 1e9, 2),
    }


def clear_allocator_cache() -> None:
    """Return the allocator's free blocks to the system (does not touch live arrays)."""
    mx.clear_cache()
