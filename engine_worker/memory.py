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


def clear_allocator_cache() -> None:
    """Return the allocator's free blocks to the system (does not touch live arrays)."""
    mx.clear_cache()
