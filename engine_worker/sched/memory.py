"""One engine worker's memory budget, and what a batch needs within it.

The budget bounds everything the worker's mlx allocator holds on the device::

    weights + KV of the running batch + a step's working memory + prefix cache + allocator cache <= total

* ``total``: ``EngineConfig.gpu_memory_utilization`` of the device's memory
  (:func:`engine_worker.runner.device_memory.device_memory_bytes`: all of a GPU, the GPU's recommended share of
  unified memory on Apple silicon, RAM on the CPU build).
* ``weights``: the model's parameter bytes.
* ``allocator_cache``: the freed buffers mlx keeps for reuse (``mx.set_cache_limit``): the working
  memory of one decode step of a full batch, and at least 1/16 of ``total``, which is what the
  next steps reuse. It is bounded because a continuous batch's KV buffers change size at every
  join and finish and are never reused: unbounded, the cache would grow to most of the device.
* ``prefix_cache``: ``cache_memory_mb``, or ``cache_memory_percent`` of ``total``. Running
  requests come first: the scheduler lowers the prefix cache's limit (least recently used
  entries go) while the batch needs the memory, and raises it again when the batch shrinks.
* the rest is the batch's: its KV and a step's working memory, which :meth:`MemoryBudget.need`
  estimates from the batch's shape before the scheduler admits or grows it.

mlx-lm's ``BatchKVCache`` keeps the batch's keys and values in one buffer per layer of
``rows x T x ...``: every row is padded to the same length ``T``, which grows in steps of
``BatchKVCache.step`` (256) tokens, and a join, a finish or a growth step copies the whole
buffer (old and new both live for a moment). :meth:`MemoryBudget.need` therefore counts the
batch's KV twice, plus one growth step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, NamedTuple

from engine_worker.runner.mlx_core import mx

from mlx.utils import tree_flatten
from mlx_lm.models.cache import BatchKVCache, KVCache

logger = logging.getLogger(__name__)

KV_STEP = BatchKVCache.step
# Copies of the batch's KV alive at once while mlx-lm extends, filters or grows it.
KV_COPIES = 2
# Vocabulary-sized float32 rows per decoding sequence: the logits, their log-softmax, and the
# generator's current and next log probabilities.
_VOCAB_ROWS = 4
# The allocator cache of a model whose sizes are unknown: mlx's own default on its CPU build.
_FALLBACK_CACHE_BYTES = 32 << 20
# The allocator cache keeps at least this share of the budget: a step's temporaries (a prefill
# chunk's attention scores above all) are then reused by the next step instead of going back to
# the device and being allocated again. With only one decode step's working memory cached, a GPU
# engine spends a large part of each prefill step allocating.
ALLOCATOR_CACHE_SHARE = 16


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
        args = getattr(model, "args", None)
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
    for _, value in tree_flatten(model.parameters()):
        if value.dtype in _FLOAT_BYTES:
            return _FLOAT_BYTES[value.dtype]
    raise ValueError("the model has no floating-point parameter")


_FLOAT_BYTES = {mx.float32: 4, mx.float16: 2, mx.bfloat16: 2}


def weights_bytes(model: Any) -> int:
    """Bytes of the model's parameters (0 for an object without ``parameters``)."""
    parameters = getattr(model, "parameters", None)
    if parameters is None:
        return 0
    return sum(v.nbytes for _, v in tree_flatten(parameters()))


class BatchShape(NamedTuple):
    """A batch as the budget sees it: ``rows`` sequences in a KV buffer ``kv_tokens`` long per row,
    of which ``prefill_rows`` prefill up to ``prefill_tokens`` tokens each in one step, over a
    context of up to ``prefill_context`` tokens."""

    rows: int
    kv_tokens: int
    prefill_rows: int = 0
    prefill_tokens: int = 0
    prefill_context: int = 0


def round_up(tokens: int) -> int:
    """``tokens`` rounded up to the KV buffer's growth step."""
    return -(-tokens // KV_STEP) * KV_STEP


@dataclass(frozen=True)
class MemoryBudget:
    """The bytes one worker may hold, and its fixed parts. ``dims`` None: the model's sizes are
    unknown, and only the allocator's limits bound it (:meth:`need` counts no KV)."""

    total: int
    weights: int
    prefix_cache: int
    allocator_cache: int
    dims: ModelDims | None = None

    def __post_init__(self) -> None:
        if self.total < self.weights + self.allocator_cache:
            raise ValueError(
                f"the memory budget ({self.total / 2**20:.0f} MiB) is smaller than the model's weights "
                f"({self.weights / 2**20:.0f} MiB) and the allocator cache ({self.allocator_cache / 2**20:.0f} MiB); "
                "raise ENGINE_GPU_MEMORY_UTILIZATION")

    def kv_bytes(self, rows: int, kv_tokens: int) -> int:
        """Bytes of a batch KV buffer of ``rows`` rows of ``kv_tokens`` tokens."""
        return rows * kv_tokens * self.dims.kv_bytes_per_token if self.dims else 0

    def working_bytes(self, shape: BatchShape) -> int:
        """A step's working memory beyond the KV: every row decodes one token (activations and
        vocabulary-sized rows), and the prefilling rows process a chunk each, with attention
        scores over their context (float32, as an unfused attention holds them)."""
        d = self.dims
        if d is None:
            return 0
        decode = shape.rows * (d.activation_bytes_per_token + _VOCAB_ROWS * d.vocab * 4)
        per_token = d.activation_bytes_per_token + d.heads * shape.prefill_context * 4
        return decode + shape.prefill_rows * shape.prefill_tokens * per_token

    def need(self, shape: BatchShape) -> int:
        """Bytes the worker holds at most while running ``shape``, the prefix cache left out:
        weights, the allocator cache, a step's working memory, and the KV counted twice (the
        copy mlx-lm makes when the batch changes) plus one growth step of every row."""
        kv = KV_COPIES * self.kv_bytes(shape.rows, shape.kv_tokens) + self.kv_bytes(shape.rows, KV_STEP)
        return self.weights + self.allocator_cache + self.working_bytes(shape) + kv

    def fits(self, shape: BatchShape) -> bool:
        """Whether ``shape`` fits once the prefix cache has given back what it must."""
        return self.need(shape) <= self.total

    def as_dict(self) -> dict[str, int]:
        return {"total": self.total, "weights": self.weights, "prefix_cache": self.prefix_cache,
                "allocator_cache": self.allocator_cache,
                "kv_bytes_per_token": self.dims.kv_bytes_per_token if self.dims else 0}

    @classmethod
    def for_model(cls, model: Any, config: Any, fraction: float, device_bytes: int | None = None) -> MemoryBudget:
        """The budget of a worker running ``model`` with the scheduler ``config`` (the seed's
        fields ``completion_batch_size``, ``cache_memory_mb``, ``cache_memory_percent``) on
        ``fraction`` of ``device_bytes`` (default: :func:`engine_worker.runner.device_memory.device_memory_bytes`).

        Raises ``ValueError`` when the weights do not fit, or when ``cache_memory_mb`` asks for
        more than the weights and the allocator cache leave.
        """
        from engine_worker.cache.budget import resolve_budget_bytes

        if device_bytes is None:
            from engine_worker.runner.device_memory import device_memory_bytes

            device_bytes, _source = device_memory_bytes()
        total = int(device_bytes * fraction)
        dims = ModelDims.of(model)
        if dims is None:
            logger.warning("the model's sizes are unknown: its KV is not budgeted, only mlx's allocator is bounded")
        weights = weights_bytes(model)
        rows = max(config.completion_batch_size, config.prefill_batch_size)
        allocator = _FALLBACK_CACHE_BYTES
        if dims is not None:
            allocator = rows * (dims.activation_bytes_per_token + _VOCAB_ROWS * dims.vocab * 4)
        allocator = max(allocator, total // ALLOCATOR_CACHE_SHARE)
        prefix = 0
        if config.enable_prefix_cache:
            prefix = resolve_budget_bytes(config.cache_memory_mb, config.cache_memory_percent, total)
        left = total - weights - allocator
        if prefix > left and config.cache_memory_mb is not None:
            raise ValueError(f"cache_memory_mb={config.cache_memory_mb} is more than the memory budget leaves "
                             f"after the weights ({max(0, left) // 2**20} MiB)")
        return cls(total=total, weights=weights, prefix_cache=max(0, min(prefix, left)),
                   allocator_cache=allocator, dims=dims)
