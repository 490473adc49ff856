"""The scheduler's memory decisions within its worker's :class:`MemoryBudget`.

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

from collections.abc import Iterable

from engine_worker.sched.memory import KV_STEP, BatchShape, MemoryBudget, round_up


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
