"""Loading a model for the engine, and reading facts about it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from engine_worker.runner.mlx_core import mx

import mlx_lm
from mlx_lm.utils import dequantize_model

from engine_worker.runner.device_memory import device_label

logger = logging.getLogger(__name__)


def load_model(path: str | Path, dtype: str | None = None) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from an mlx-lm model folder.

    On the CPU the weights are made fp32 (dequantized first if needed): only fp32 matmuls use the
    fast BLAS there; bf16/fp16/4-bit run many times slower. ``dtype`` (e.g. ``"bfloat16"``)
    overrides that choice.
    """
    model, tokenizer = mlx_lm.load(str(path))[:2]  # (model, tokenizer, config) with return_config
    target = getattr(mx, dtype) if dtype else (mx.float32 if device_label() == "cpu" else None)
    if target is not None:
        if target == mx.float32 and _is_quantized(model):
            model = dequantize_model(model)
        model.set_dtype(target)
        mx.eval(model.parameters())
    logger.info("loaded model from %s (context %s, device %s)", path, context_length(model), device_label())
    return model, tokenizer


def _is_quantized(model: Any) -> bool:
    import mlx.nn as nn

    return any(isinstance(m, nn.QuantizedLinear | nn.QuantizedEmbedding) for _, m in model.named_modules())


def context_length(model: Any, default: int | None = None) -> int | None:
    """The model's context (``max_position_embeddings`` or an equivalent config key)."""
    args = getattr(model, "args", None)
    for key in ("max_position_embeddings", "max_seq_len", "n_positions", "seq_length"):
        value = getattr(args, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return default


def vocab_size(model: Any) -> int | None:
    value = getattr(getattr(model, "args", None), "vocab_size", None)
    return value if isinstance(value, int) and value > 0 else None


def drop_model_caches(model: Any) -> None:
    """Drop every KV cache reference a model (or its layers' attention) may hold, as the seed's
    ``deep_reset`` does: some model implementations keep one between calls."""
    for obj in [model, *getattr(model, "layers", [])]:
        for holder in (obj, getattr(obj, "self_attn", None)):
            if holder is not None and hasattr(holder, "cache"):
                holder.cache = None
