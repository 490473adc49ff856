"""The on-disk format of one cache entry: a safetensors file with a checksum.

Layout: arrays ``tokens`` (int64), ``l{layer}.k{part}`` / ``l{layer}.v{part}`` (one part plain,
three parts quantized), and the snapshot's parameters as safetensors header metadata. The blake2b
checksum of the whole file is kept by the caller (SSD index or persistence manifest), so a
truncated or bit-flipped file is detected before it is parsed.

Threading: :func:`encode` and :func:`write_file`/:func:`read_file` use numpy only, so they run on
the SSD tier's background thread. The two mlx conversions (:func:`to_host`, :func:`from_host`)
run on the engine thread; ``to_host`` is zero-copy for numpy-representable dtypes.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from engine_worker.runner.mlx_core import mx

import numpy as np
import safetensors.numpy as st
from safetensors import SafetensorError

from engine_worker.cache import kv
from engine_worker.cache.types import CacheEntryCorrupt

FORMAT_VERSION = "1"


@dataclass(frozen=True, slots=True)
class HostEntry:
    """An entry as host (numpy) arrays: what crosses between the engine and I/O threads."""

    tokens: np.ndarray
    arrays: dict[str, np.ndarray]
    meta: dict[str, str]


def _host_array(x: mx.array) -> np.ndarray:
    if x.dtype == mx.bfloat16:
        # numpy has no bfloat16: carry the bits as uint16; "dtype" in the metadata restores it.
        x = x.view(mx.uint16)
    return np.asarray(x)


def to_host(tokens: np.ndarray, snap: kv.KVSnapshot) -> HostEntry:
    """Zero-copy numpy views of an (evaluated) snapshot; call on the engine thread."""
    arrays: dict[str, np.ndarray] = {}
    rotating = []
    for i, layer in enumerate(snap.layers):
        for j, part in enumerate(layer.keys):
            arrays[f"l{i}.k{j}"] = _host_array(part)
        for j, part in enumerate(layer.values):
            arrays[f"l{i}.v{j}"] = _host_array(part)
        rotating.append(list(layer.rotating) if layer.rotating else None)
    meta = {
        "format": FORMAT_VERSION,
        "num_tokens": str(snap.num_tokens),
        "dtype": snap.dtype,
        "bits": str(snap.bits or 0),
        "group_size": str(snap.group_size or 0),
        "layers": str(len(snap.layers)),
        "parts": str(len(snap.layers[0].keys)),
        "rotating": json.dumps(rotating),
    }
    return HostEntry(np.ascontiguousarray(tokens, dtype=np.int64), arrays, meta)


def is_trimmable(entry: HostEntry) -> bool:
    """False when a layer is a wrapped sliding window ((max_size, keep, idx) parameters)."""
    return all(r is None or len(r) == 2 for r in json.loads(entry.meta["rotating"]))


def _mx_array(a: np.ndarray, dtype: str, quantized_part: bool) -> mx.array:
    out = mx.array(a)
    if dtype == "bfloat16" and not quantized_part:
        out = out.view(mx.bfloat16)
    return out


def from_host(entry: HostEntry) -> kv.KVSnapshot:
    """Rebuild a snapshot from host arrays (copies into mlx memory; call on the engine thread)."""
    meta = entry.meta
    if meta.get("format") != FORMAT_VERSION:
        raise CacheEntryCorrupt("<memory>", f"unknown format {meta.get('format')!r}")
    dtype = meta["dtype"]
    bits = int(meta["bits"]) or None
    n_layers, n_parts = int(meta["layers"]), int(meta["parts"])
    rotating = json.loads(meta["rotating"])
    layers = []
    for i in range(n_layers):
        # Quantized parts: packed uint32, then scales and biases in the original dtype.
        keys = tuple(_mx_array(entry.arrays[f"l{i}.k{j}"], dtype, bits is not None and j == 0)
                     for j in range(n_parts))
        values = tuple(_mx_array(entry.arrays[f"l{i}.v{j}"], dtype, bits is not None and j == 0)
                       for j in range(n_parts))
        rot = tuple(rotating[i]) if rotating[i] else None
        layers.append(kv.LayerKV(keys, values, rot))
    mx.eval([a for layer in layers for a in (*layer.keys, *layer.values)])
    group = int(meta["group_size"]) or None
    return kv.KVSnapshot(tuple(layers), int(meta["num_tokens"]), dtype, bits, group)


def encode(entry: HostEntry) -> bytes:
    tensors = {"tokens": entry.tokens, **entry.arrays}
    return st.save(tensors, metadata=entry.meta)


def checksum(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def write_file(path: Path, entry: HostEntry) -> tuple[int, str]:
    """Write atomically (temp file + rename, so a crash never leaves a half file under the final
    name). Returns ``(file_bytes, checksum)``."""
    data = encode(entry)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)
    return len(data), checksum(data)


def _header_metadata(data: bytes) -> dict[str, str]:
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    return dict(header.get("__metadata__") or {})


def read_file(path: Path, expected_checksum: str | None) -> HostEntry:
    """Read and verify one entry. Raises :class:`CacheEntryCorrupt` for a checksum mismatch or an
    unparsable file, ``OSError`` when it cannot be read at all."""
    data = path.read_bytes()
    if expected_checksum is not None and checksum(data) != expected_checksum:
        raise CacheEntryCorrupt(str(path), "checksum mismatch")
    try:
        tensors = st.load(data)
        meta = _header_metadata(data)
    except (SafetensorError, ValueError, struct.error) as exc:
        raise CacheEntryCorrupt(str(path), f"unparsable: {exc}") from exc
    tokens = tensors.pop("tokens", None)
    if tokens is None or meta.get("format") != FORMAT_VERSION:
        raise CacheEntryCorrupt(str(path), "missing tokens or unknown format")
    return HostEntry(tokens, tensors, meta)
