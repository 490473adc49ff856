"""Immutable snapshots of mlx-lm per-layer KV caches, and fresh caches rebuilt from them.

A snapshot holds, per layer, the keys and values of the first ``num_tokens`` positions as their
own contiguous arrays (optionally quantized with ``mx.quantize``). It never aliases a live cache
object, and :func:`restore` hands out *new* cache objects whose arrays are slices of the stored
ones: mlx arrays are immutable to us and ``KVCache.update_and_fetch`` reallocates before it
appends, so a borrower can never write into what the cache keeps.

Supported layer types: ``KVCache`` and ``RotatingKVCache``. A rotating cache that has not wrapped
yet keeps its first ``offset`` positions in temporal order, so it is trimmable like a KVCache.
One that wrapped (a sliding window over a sequence longer than ``max_size``) cannot be cut to a
shorter prefix: it is stored whole (``trimmable=False``) and can only be restored whole, i.e. it
only serves prompts that *extend* its tokens (the next turn of a conversation). Anything else
(``ArraysCache`` state of recurrent layers, an already quantized cache) raises
:class:`UnsupportedCache` and is not stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine_worker.runner.mlx_core import mx

from mlx_lm.models.cache import KVCache, RotatingKVCache, can_trim_prompt_cache, trim_prompt_cache

from engine_worker.cache.types import UnsupportedCache


@dataclass(frozen=True, slots=True)
class LayerKV:
    """One layer: ``keys``/``values`` are ``(k,)`` plain or ``(packed, scales, biases)`` quantized."""

    keys: tuple[mx.array, ...]
    values: tuple[mx.array, ...]
    # RotatingKVCache layers: (max_size, keep) while unwrapped, (max_size, keep, idx) once wrapped
    # (then keys/values are its whole rotated buffer). None for a KVCache layer.
    rotating: tuple[int, ...] | None = None

    @property
    def wrapped(self) -> bool:
        return self.rotating is not None and len(self.rotating) == 3


@dataclass(frozen=True, slots=True)
class KVSnapshot:
    layers: tuple[LayerKV, ...]
    num_tokens: int
    dtype: str  # the keys' dtype before quantization, e.g. "float32"
    bits: int | None = None
    group_size: int | None = None

    @property
    def quantized(self) -> bool:
        return self.bits is not None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for layer in self.layers for a in (*layer.keys, *layer.values))

    @property
    def trimmable(self) -> bool:
        """False when some layer is a wrapped sliding window: restorable only whole."""
        return not any(layer.wrapped for layer in self.layers)


def _layer_kind(layer: Any, num_tokens: int) -> tuple[int, ...] | None:
    """Validate one live layer and return its rotating parameters (None for a plain KVCache)."""
    if type(layer) is KVCache:
        rotating: tuple[int, ...] | None = None
    elif type(layer) is RotatingKVCache:
        rotating = (int(layer.max_size), int(layer.keep))
        if layer.offset >= layer.max_size:
            if num_tokens != layer.offset:
                raise UnsupportedCache("a wrapped RotatingKVCache can only be stored whole")
            rotating = (*rotating, int(layer._idx))  # _idx is part of its public state tuple
    else:
        raise UnsupportedCache(type(layer).__name__)
    if layer.keys is None or layer.offset < num_tokens or layer.keys.shape[0] != 1:
        raise UnsupportedCache(f"{type(layer).__name__}(offset={layer.offset}, batch!=1 or empty)")
    return rotating


def is_storable(cache_layers: Sequence[Any]) -> bool:
    """True when :func:`snapshot` accepts these layers whole (cheap: no array work)."""
    try:
        offset = cache_offset(cache_layers)
        for layer in cache_layers:
            _layer_kind(layer, offset)
    except UnsupportedCache:
        return False
    return bool(cache_layers)


def is_sliceable(cache_layers: Sequence[Any]) -> bool:
    """True when any prefix of these layers can be cut out (the paged cache needs this)."""
    return is_storable(cache_layers) and all(
        type(c) is KVCache or c.offset < c.max_size for c in cache_layers)


def batchable(cache_layers: Sequence[Any]) -> bool:
    """Whether the generator can merge these layers into its batch (mlx-lm's ``QuantizedKVCache``,
    for one, has no ``merge``: inserting it would fail the whole batch's next step)."""
    return all(hasattr(layer, "merge") for layer in cache_layers)


def trimmable(cache_layers: list[Any]) -> bool:
    """Whether every layer of a live per-layer cache can drop its last positions (mlx-lm's rule: a
    rotating cache that wrapped, or a recurrent state, cannot)."""
    return can_trim_prompt_cache(cache_layers)


def trim(cache_layers: list[Any], num_tokens: int) -> int:
    """Drop the last ``num_tokens`` positions of a live per-layer cache in place; returns how many
    were dropped."""
    trimmed: int = trim_prompt_cache(cache_layers, num_tokens)  # type: ignore[assignment]  # mlx-lm annotates a list; it returns the count
    return trimmed


def cache_offset(cache_layers: Sequence[Any]) -> int:
    """Positions held by a per-layer cache list (the first layer's offset; 0 when empty)."""
    return int(getattr(cache_layers[0], "offset", 0)) if cache_layers else 0


def snapshot(cache_layers: Sequence[Any], num_tokens: int, *, evaluate: bool = True) -> KVSnapshot:
    """Copy the first ``num_tokens`` positions of a live per-layer cache into a snapshot.

    Evaluates the copies (once, all layers together) so that the byte count is real memory and
    the live cache's larger step-allocated buffers are not kept alive by a lazy graph. With
    ``evaluate=False`` the copies stay lazy: the caller evaluates them, with other snapshots',
    through :func:`evaluate` before it keeps the snapshot.
    """
    if num_tokens <= 0 or not cache_layers:
        raise UnsupportedCache("empty cache")
    layers = []
    for layer in cache_layers:
        rotating = _layer_kind(layer, num_tokens)
        # A wrapped window is copied whole (its buffer is shorter than num_tokens anyway).
        keys = mx.contiguous(layer.keys[..., :num_tokens, :])
        values = mx.contiguous(layer.values[..., :num_tokens, :])
        layers.append(LayerKV((keys,), (values,), rotating))
    dtype = str(layers[0].keys[0].dtype).removeprefix("mlx.core.")
    snap = KVSnapshot(tuple(layers), num_tokens, dtype)
    if evaluate:
        evaluate_all([snap])
    return snap


def evaluate_all(snaps: Sequence[KVSnapshot]) -> None:
    """Evaluate the arrays of ``snaps`` in one ``mx.eval``: one device sync however many
    snapshots (a step's finished requests each store one)."""
    arrays = [a for snap in snaps for layer in snap.layers for a in (*layer.keys, *layer.values)]
    if arrays:
        mx.eval(arrays)


def can_quantize(snap: KVSnapshot, group_size: int) -> bool:
    """mx.quantize needs the head dimension to be a multiple of the group size."""
    head_dim = snap.layers[0].keys[0].shape[-1]
    value_dim = snap.layers[0].values[0].shape[-1]
    return not snap.quantized and head_dim % group_size == 0 and value_dim % group_size == 0


def quantize(snap: KVSnapshot, bits: int, group_size: int, *, evaluate: bool = True) -> KVSnapshot:
    """A quantized copy: ``bits`` per element plus one scale and one bias per group (in the
    original dtype), so fp32 → 8-bit/group 64 stores 9 bits per element instead of 32.
    ``evaluate=False`` leaves it lazy, as :func:`snapshot` does."""
    layers = []
    for layer in snap.layers:
        keys = tuple(mx.quantize(layer.keys[0], group_size=group_size, bits=bits))
        values = tuple(mx.quantize(layer.values[0], group_size=group_size, bits=bits))
        layers.append(LayerKV(keys, values, layer.rotating))
    quantized = KVSnapshot(tuple(layers), snap.num_tokens, snap.dtype, bits, group_size)
    if evaluate:
        evaluate_all([quantized])
    return quantized


def _plain(parts: tuple[mx.array, ...], snap: KVSnapshot, num_tokens: int) -> mx.array:
    if not snap.quantized:
        return parts[0][..., :num_tokens, :]
    packed, scales, biases = (p[..., :num_tokens, :] for p in parts)
    out = mx.dequantize(packed, scales, biases, group_size=snap.group_size, bits=snap.bits)
    return out.astype(getattr(mx, snap.dtype))


def restore(snap: KVSnapshot, num_tokens: int) -> list[Any]:
    """Fresh per-layer caches holding the first ``num_tokens`` positions (dequantized to the
    original dtype: a QuantizedKVCache cannot be merged into a BatchGenerator batch)."""
    if not 0 < num_tokens <= snap.num_tokens:
        raise ValueError(f"cannot restore {num_tokens} of {snap.num_tokens} tokens")
    if not snap.trimmable and num_tokens != snap.num_tokens:
        raise ValueError("a wrapped sliding-window snapshot can only be restored whole")
    caches: list[Any] = []
    for layer in snap.layers:
        keys = _plain(layer.keys, snap, num_tokens)
        values = _plain(layer.values, snap, num_tokens)
        if layer.rotating is None:
            cache: Any = KVCache()
            cache.state = (keys, values, num_tokens)
        else:
            max_size, keep = layer.rotating[:2]
            idx = layer.rotating[2] if layer.wrapped else num_tokens
            cache = RotatingKVCache(max_size=max_size, keep=keep)
            cache.state = (keys, values, num_tokens, keep, max_size, idx)
        caches.append(cache)
    return caches
