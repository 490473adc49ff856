"""One engine worker's memory budget, and what a batch needs within it.

The budget bounds everything the worker's mlx allocator holds on the device::

    weights + KV of the running batch + a step's working memory + prefix cache + allocator cache <= total

* ``total``: ``EngineConfig.gpu_memory_utilization`` of the device's memory
  (:func:`engine_worker.runner.device_memory.device_memory_bytes`: all of a GPU, the GPU's recommended share of
  unified memory on Apple silicon, RAM on the CPU build).
* ``weights``: the model's parameter bytes.
* ``allocator_cache``: what the budget reserves for the freed buffers mlx keeps for reuse: a
  step's working memory, and at most 1/16 of ``total``. What mlx may keep (``mx.set_cache_limit``,
  :class:`AllocatorCache`) is less: about one step's worth, measured. A continuous batch's KV
  buffers change size at every join and finish and are never reused: a cache larger than a step
  fills with them, and they are the device memory a worker held beyond its batch. The engine
  also empties the cache after each step in which a request finished and every 32 busy steps
  (:mod:`engine_worker.runner.buffer_release`).
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

Within it, the scheduler's memory decisions (:class:`MemoryGuard`):

* **Admission**: a waiting request joins the batch only if the batch, with it, still fits
  (:meth:`BatchPlan.admit`), counting the copy mlx-lm makes when the batch changes and one growth
  step of every row, so that a batch admitted can decode on until its next growth check.
* **Growth**: before each generator step the batch as it is must fit (:meth:`MemoryGuard.headroom`);
  when it does not, the scheduler preempts the least urgent requests (they wait again and
  re-prefill later), as many as :meth:`MemoryGuard.rows_that_fit` says, in one removal.
* **Prefix cache**: what it may hold is the headroom the batch leaves, up to its own limit.
* **Allocation failure**: a step that ran out of memory halves the batch the scheduler may run
  (:meth:`MemoryGuard.allocation_failed`); the cap doubles again after every ``KV_STEP`` clean
  steps, the interval at which a batch's KV buffer grows, its largest allocation, so a cap that
  lasted that long has been through it.

The batch's KV is measured, not modelled: the runner reports its KV buffers' bytes, and the
buffer's length per row follows from them. No I/O; all of it runs on the engine thread.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from engine_worker.cache.budget import resolve_budget_bytes
from engine_worker.common.config import SchedulerConfig
from engine_worker.runner import device_memory
from engine_worker.runner.device_memory import KV_STEP, ModelDims

logger = logging.getLogger(__name__)

# Copies of the batch's KV alive at once while mlx-lm extends, filters or grows it.
KV_COPIES = 2
# Vocabulary-sized float32 rows per decoding sequence: the logits, their log-softmax, and the
# generator's current and next log probabilities.
_VOCAB_ROWS = 4
# The allocator cache of a model whose sizes are unknown: mlx's own default on its CPU build.
_FALLBACK_CACHE_BYTES = 32 << 20
# The budget reserves at least this share for the allocator cache (what mlx keeps is bounded by
# the measured step, below, and never more than this).
ALLOCATOR_CACHE_SHARE = 16
# What mlx keeps: this many times the largest step's working memory seen (the step's temporaries,
# which the next step reuses, and as much again for the KV buffers a join, finish or growth frees
# meanwhile, which would otherwise push the temporaries out).
CACHE_STEPS = 2


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
    step_bytes: int = 0  # what the allocator keeps at first: twice a full batch's decode step, estimated

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
    def for_model(cls, model: object, config: SchedulerConfig, fraction: float,
                  device_bytes: int | None = None) -> MemoryBudget:
        """The budget of a worker running ``model`` with the scheduler ``config`` (the seed's
        fields ``completion_batch_size``, ``cache_memory_mb``, ``cache_memory_percent``) on
        ``fraction`` of ``device_bytes`` (default: :func:`engine_worker.runner.device_memory.device_memory_bytes`).
        A model whose sizes or weights cannot be measured is accepted: the budget counts what it
        can (no KV, weights of 0).

        Raises ``ValueError`` when the weights do not fit, or when ``cache_memory_mb`` asks for
        more than the weights and the allocator cache leave.
        """
        if device_bytes is None:
            device_bytes, _source = device_memory.device_memory_bytes()
        total = int(device_bytes * fraction)
        dims = ModelDims.of(model)
        if dims is None:
            logger.warning("the model's sizes are unknown: its KV is not budgeted, only mlx's allocator is bounded")
        weights = device_memory.weights_bytes(model)
        rows = max(config.completion_batch_size, config.prefill_batch_size)
        # A decode step of a full batch; a larger step (a long prefill) is measured when it runs.
        step = _FALLBACK_CACHE_BYTES
        if dims is not None:
            step = rows * (dims.activation_bytes_per_token + _VOCAB_ROWS * dims.vocab * 4)
        allocator = max(CACHE_STEPS * step, total // ALLOCATOR_CACHE_SHARE)
        prefix = 0
        if config.enable_prefix_cache:
            prefix = resolve_budget_bytes(config.cache_memory_mb, config.cache_memory_percent, total)
        left = total - weights - allocator
        if prefix > left and config.cache_memory_mb is not None:
            raise ValueError(f"cache_memory_mb={config.cache_memory_mb} is more than the memory budget leaves "
                             f"after the weights ({max(0, left) // 2**20} MiB)")
        return cls(total=total, weights=weights, prefix_cache=max(0, min(prefix, left)),
                   allocator_cache=allocator, dims=dims, step_bytes=min(CACHE_STEPS * step, allocator))


# ---- the batch within the budget -----------------------------------------------------------------

class BatchPlan:
    """The batch of this step as admission grows it, starting from what is running."""

    def __init__(self, guard: MemoryGuard, kv_bytes: int, rows: int, longest: int,
                 prefills: Iterable[tuple[int, int]]) -> None:
        """``kv_bytes``: what the generator's KV buffers hold now; ``longest``: the longest
        sequence whose KV is not in ``kv_bytes``; ``prefills``: ``(sequence length, tokens still
        to prefill)`` of prefilling rows.

        The buffer's length per row is the larger of what the bytes say (a decoding row's KV is
        allocated: rows are padded to the longest, and a row that joined late is padded on the
        left by the others' progress) and the longest sequence not allocated yet."""
        self._guard = guard
        self.rows = rows
        self._prefills = list(prefills)
        longest = max(longest, *(s for s, _ in self._prefills)) if self._prefills else longest
        bpt = guard.budget.dims.kv_bytes_per_token if guard.budget.dims else 0
        measured = -(-kv_bytes // (rows * bpt)) if rows and bpt else 0
        self.kv_tokens = max(measured, round_up(longest + 1)) if rows else 0

    def shape(self, extra: tuple[int, int] | None = None) -> BatchShape:
        """The batch's shape, with one more row ``extra`` = ``(sequence length, tokens to prefill)``."""
        prefills = self._prefills if extra is None else [*self._prefills, extra]
        rows, kv_tokens = self.rows, self.kv_tokens
        if extra is not None:
            rows += 1
            kv_tokens = max(kv_tokens, round_up(extra[0] + 1))
        guard = self._guard
        return BatchShape(
            rows=rows,
            kv_tokens=kv_tokens,
            prefill_rows=min(guard.prefill_batch, len(prefills)),
            prefill_tokens=min(guard.prefill_step, max((p for _, p in prefills), default=0)),
            prefill_context=max((s for s, _ in prefills), default=0),
        )

    def admit(self, sequence_tokens: int, prefill_tokens: int) -> bool:
        """Add a row of ``sequence_tokens`` (``prefill_tokens`` of them still to compute) if the
        batch still fits with it; False (and nothing changes) if not."""
        extra = (sequence_tokens, prefill_tokens)
        shape = self.shape(extra)
        if not self._guard.budget.fits(shape):
            return False
        self.rows, self.kv_tokens = shape.rows, shape.kv_tokens
        self._prefills.append(extra)
        return True


class MemoryGuard:
    """Budget checks and the batch cap for one scheduler."""

    def __init__(self, budget: MemoryBudget, prefill_batch: int, prefill_step: int) -> None:
        self.budget = budget
        self.prefill_batch = prefill_batch
        self.prefill_step = prefill_step
        self.batch_cap: int | None = None  # set after an allocation failure
        self._clean_steps = 0
        self.allocator = AllocatorCache(budget)

    @property
    def bounds_kv(self) -> bool:
        """False when the model's sizes are unknown: then only the allocator's limits apply."""
        return self.budget.dims is not None

    def plan(self, kv_bytes: int, rows: int, longest: int, prefills: Iterable[tuple[int, int]]) -> BatchPlan:
        return BatchPlan(self, kv_bytes, rows, longest, prefills)

    def headroom(self, plan: BatchPlan) -> int:
        """Bytes the budget leaves beside the batch as it grows this step, the prefix cache left
        out (negative: the batch does not fit even with the prefix cache empty)."""
        return self.budget.total - self.budget.need(plan.shape())

    def rows_that_fit(self, plan: BatchPlan) -> int:
        """How many of the batch's rows fit (0 if not even one), their KV as long as now."""
        shape = plan.shape()
        rows = shape.rows
        while rows > 0 and not self.budget.fits(shape._replace(rows=rows)):
            rows -= 1
        return rows

    def cap(self, limit: int) -> int:
        """The requests the batch may hold: ``limit``, or less after an allocation failure."""
        return limit if self.batch_cap is None else min(limit, self.batch_cap)

    def allocation_failed(self, running: int) -> None:
        """A step of ``running`` requests ran out of memory: run at most half as many."""
        self.batch_cap = max(1, running // 2)
        self._clean_steps = 0

    def step_succeeded(self, limit: int) -> None:
        if self.batch_cap is None:
            return
        self._clean_steps += 1
        if self._clean_steps >= KV_STEP:
            self._clean_steps = 0
            self.batch_cap = None if self.batch_cap * 2 >= limit else self.batch_cap * 2


class AllocatorCache:
    """What mlx's allocator may keep of freed buffers: ``CACHE_STEPS`` times the largest step's
    working memory seen, within the budget's ``allocator_cache``; it starts at the budget's
    estimate of a step and only grows.

    A step's working memory is read from mlx's peak (``mx.get_peak_memory``) without resetting it
    (others read the peak since start): a step that raised the peak used the new peak less what
    was live before and after it. Steps that stay under the peak are not read: one of them may have
    needed more working memory beside less live memory, and the cache then holds less than it
    could, never more."""

    def __init__(self, budget: MemoryBudget) -> None:
        self._cap = budget.allocator_cache
        self.limit = budget.step_bytes or budget.allocator_cache
        self._active = self._peak = 0

    def before_step(self) -> None:
        self._active, self._peak = device_memory.active_and_peak()

    def after_step(self) -> None:
        active, peak = device_memory.active_and_peak()
        if peak <= self._peak:
            return
        # What the step freed again: its peak above what was live before and after it (the
        # batch's KV, grown by a join, stays live and is not working memory).
        want = min(self._cap, CACHE_STEPS * (peak - max(self._active, active)))
        if want > self.limit:
            self.limit = want
            device_memory.set_cache_limit(want)
