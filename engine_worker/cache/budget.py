"""How many bytes the prefix cache may hold: ``cache_memory_mb``, or a fraction of the device's
memory (system RAM on a CPU build, where ``mx.device_info()`` has no ``memory_size``)."""

from __future__ import annotations

import logging
import os

import mlx.core as mx

logger = logging.getLogger(__name__)

MB = 1024 * 1024


def device_memory_bytes() -> tuple[int, str]:
    """``(bytes, label)`` of the memory KV caches live in: the accelerator's unified/device memory
    when mlx reports it, else physical RAM (the CPU backend allocates from it)."""
    info = mx.device_info()
    # Metal reports "memory_size", CUDA "total_memory"; the CPU backend reports neither.
    for key in ("memory_size", "total_memory"):
        size = info.get(key)
        if isinstance(size, int) and size > 0:
            return size, str(mx.default_device())
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "cpu-ram"
    except (ValueError, OSError):
        # sysconf names are missing on some platforms; 8 GiB keeps a 20 % budget modest.
        logger.warning("cannot read the physical memory size; assuming 8 GiB")
        return 8 * 1024 * MB, "assumed"


def resolve_budget_bytes(max_memory_mb: float | None, max_memory_percent: float) -> int:
    """The byte budget: an explicit ``max_memory_mb`` wins; otherwise ``max_memory_percent``
    (a fraction in (0, 1]) of :func:`device_memory_bytes`."""
    if max_memory_mb is not None:
        if max_memory_mb < 0:
            raise ValueError("cache_memory_mb must be >= 0")
        return int(max_memory_mb * MB)
    if not 0.0 < max_memory_percent <= 1.0:
        raise ValueError("cache_memory_percent must be in (0, 1]")
    total, _label = device_memory_bytes()
    return int(total * max_memory_percent)
