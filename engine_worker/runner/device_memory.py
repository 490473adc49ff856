"""Accelerator memory: figures in bytes labelled with the device they describe, the allocator's
limits, how an allocation failure is recognised, and the sizes of a model that its memory use
follows (what :mod:`engine_worker.sched.memory` budgets with).

Nothing here assumes Metal: the figures come from ``mx.get_active_memory()`` and friends, which
work on the CPU, CUDA and Metal builds alike.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, cast

from engine_worker.runner.mlx_core import mx

from mlx.utils import tree_flatten
from mlx_lm.models.cache import BatchKVCache, KVCache

logger = logging.getLogger(__name__)


def device_label() -> str:
    """``"metal"``, ``"cuda"`` or ``"cpu"``: the device mlx computes on by default."""
    if mx.default_device().type == mx.DeviceType.gpu:
        if mx.metal.is_available():
            return "metal"
        if mx.cuda.is_available():
            return "cuda"
        return "gpu"
    return "cpu"


def device_memory_bytes() -> tuple[int, str]:
    """``(bytes, source)``: the memory a worker's budget is a fraction of.

    * CUDA: the device's ``total_memory``.
    * Metal: ``max_recommended_working_set_size``, the share of the unified memory macOS lets the
      GPU keep resident; the rest stays the operating system's (``memory_size`` is all of RAM).
    * CPU build (``mx.device_info()`` reports no size): physical RAM, which mlx allocates from.
    """
    info = mx.device_info()
    for key in ("total_memory", "max_recommended_working_set_size", "memory_size"):
        size = info.get(key)
        if isinstance(size, int) and size > 0:
            return size, key
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical_ram"
    except (ValueError, OSError):
        # sysconf names are missing on some platforms; 8 GiB keeps a fractional budget modest.
        logger.warning("cannot read the physical memory size; assuming 8 GiB")
        return 8 << 30, "assumed"


def memory_stats() -> dict[str, Any]:
    """``{"device", "active_bytes", "peak_bytes", "cache_bytes", "limit_bytes"}``: mlx's allocator
    now (``peak_bytes`` is the most it held in live arrays since start or the last reset)."""
    return {
        "device": device_label(),
        "active_bytes": int(mx.get_active_memory()),
        "peak_bytes": int(mx.get_peak_memory()),
        "cache_bytes": int(mx.get_cache_memory()),
        "limit_bytes": int(mx.get_memory_limit()),
    }


def apply_allocator_limits(total_bytes: int, cache_bytes: int) -> None:
    """Bound mlx's allocator for this process: at most ``cache_bytes`` of freed buffers are kept
    for reuse (``mx.set_cache_limit``; beyond it a freed buffer goes back to the device), and
    before it grows past ``total_bytes`` it gives its whole cache back (``mx.set_memory_limit``).

    mlx's own defaults keep freed buffers up to the memory limit, 95 % of the device on CUDA:
    a continuous batch frees buffers of a new size at every join and finish, which are never
    reused, so the cache alone would grow to tens of GB. Process-wide: one engine per process.
    """
    mx.set_memory_limit(int(total_bytes))
    mx.set_cache_limit(int(cache_bytes))


def set_cache_limit(cache_bytes: int) -> None:
    """Keep at most ``cache_bytes`` of freed buffers for reuse (see :func:`apply_allocator_limits`)."""
    mx.set_cache_limit(int(cache_bytes))


def active_and_peak() -> tuple[int, int]:
    """Bytes in live arrays now, and the most held since start (or the last reset)."""
    return int(mx.get_active_memory()), int(mx.get_peak_memory())


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


def is_allocation_failure(exc: BaseException) -> bool:
    """Whether ``exc``, raised out of a generator step, means the device could not provide memory.

    mlx 0.32.4 has no exception type of its own: every failure inside the evaluation of a graph
    reaches Python as a plain ``RuntimeError`` (a C++ ``std::runtime_error``: CUDA's
    ``cudaMallocAsync ... failed: out of memory``, Metal's ``[malloc] Unable to allocate`` and
    ``Resource limit exceeded``), and a host ``std::bad_alloc`` as ``MemoryError``. Wrong
    arguments are ``ValueError``/``TypeError``, and errors of Python code are other types (or
    subclasses of ``RuntimeError``, such as ``RecursionError``). So the type alone tells a
    failure of the device's evaluation from a bug, and this function never reads the message.

    It cannot tell an allocation failure from another failure of the device (a kernel that
    fails for one shape). The caller's response fits both: free caches and retry with a smaller
    batch; a failure that does not go away ends, batch halved down to one request, with only
    that request failing.

    The CPU build raises nothing: its allocator does not check ``malloc``'s result, and the
    process dies of a segmentation fault (mlx 0.32.4, an array larger than ``ulimit -v`` allows).
    There the budget's admission is the only protection.
    """
    return type(exc) is RuntimeError or isinstance(exc, MemoryError)


# ---- a model's sizes ---------------------------------------------------------------------------

# The generator's batch KV buffer grows by this many tokens per row (mlx-lm's BatchKVCache).
KV_STEP = BatchKVCache.step


@dataclass(frozen=True)
class ModelDims:
    """The sizes of a decoder-only model that its memory use follows."""

    kv_layers: int
    kv_heads: int
    head_dim: int
    heads: int
    hidden: int
    intermediate: int
    vocab: int
    dtype_bytes: int

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.kv_layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def activation_bytes_per_token(self) -> int:
        """Intermediates of one token through one layer at their widest (the residual stream,
        attention in and out, the MLP's gate, up and product)."""
        return self.dtype_bytes * (4 * self.hidden + 3 * self.intermediate)

    @classmethod
    def of(cls, model: Any) -> ModelDims | None:
        """Read from an mlx-lm model's ``args``; None for a model whose sizes are not there."""
        args: Any = getattr(model, "args", None)  # read inside the try: None fails as AttributeError
        try:
            layers = int(args.num_hidden_layers)
            heads = int(args.num_attention_heads)
            hidden = int(args.hidden_size)
            kv_heads = int(getattr(args, "num_key_value_heads", None) or heads)
            head_dim = int(getattr(args, "head_dim", None) or hidden // heads)
            dims = cls(
                kv_layers=_attention_layers(model, layers), kv_heads=kv_heads, head_dim=head_dim,
                heads=heads, hidden=hidden, intermediate=int(args.intermediate_size),
                vocab=int(args.vocab_size), dtype_bytes=_compute_dtype_bytes(model),
            )
        except (AttributeError, TypeError, ValueError):
            return None
        return dims


def _attention_layers(model: Any, layers: int) -> int:
    """Layers whose cache grows with the sequence (recurrent layers keep a fixed-size state)."""
    make_cache = getattr(model, "make_cache", None)
    if make_cache is None:
        return layers
    return sum(1 for c in make_cache() if isinstance(c, KVCache))


def _compute_dtype_bytes(model: Any) -> int:
    """Bytes of the dtype activations and KV are computed in: that of the first floating-point
    parameter (a quantized model's weights are packed integers; its scales are floating)."""
    for _, value in _flat(model.parameters()):
        if isinstance(value, mx.array) and value.dtype in _FLOAT_BYTES:
            return _FLOAT_BYTES[value.dtype]
    raise ValueError("the model has no floating-point parameter")


_FLOAT_BYTES = {mx.float32: 4, mx.float16: 2, mx.bfloat16: 2}


def _flat(tree: Any) -> list[tuple[str, Any]]:
    """``tree_flatten``'s ``(path, leaf)`` pairs (a list when no ``destination`` is given; its
    annotation also allows the dict it fills for one)."""
    return cast(list[tuple[str, Any]], tree_flatten(tree))


def weights_bytes(model: Any) -> int:
    """Bytes of the model's mlx parameters; what cannot be measured counts 0 (an object without
    ``parameters``, or whose parameters are not mlx arrays, such as a test's ``MagicMock``)."""
    parameters = getattr(model, "parameters", None)
    if not callable(parameters):
        return 0
    return sum(v.nbytes for _, v in _flat(parameters()) if isinstance(v, mx.array))
