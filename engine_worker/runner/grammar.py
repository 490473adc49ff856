"""Constrained rows in the batch: each one samples only tokens its grammar allows.

A constrained row gets a :class:`RowSampler` as its per-row sampler in mlx-lm's
``BatchGenerator``; free rows keep their shared samplers, and all rows still decode in one batched
forward pass. The generator calls every row's sampler once per step, in row order. The first
constrained row called in a step has :class:`ConstrainedRows` compute the masks of *all* its rows
in one call: it evaluates the tokens those rows sampled last step (one sync; mlx already computed
them asynchronously), advances each row's matcher by its token, and fills one bitmask for the
lot. The other constrained rows of the step find their mask ready.

A row's matcher starts from its grammar and the tokens the row already produced (``replay``), so a
preempted request that runs again continues in the same grammar state.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, cast

from engine_worker.runner.mlx_core import mx

import llguidance
import llguidance.hf
import llguidance.numpy as llg_numpy
import numpy as np

from engine_worker.common.grammar import ConstraintError, grammar_for
from engine_worker.common.request import Constraint

logger = logging.getLogger(__name__)

Sampler = Callable[[mx.array], mx.array]


class RowSampler:
    """One constrained row's sampler: mask, renormalize, then the row's own sampling settings."""

    __slots__ = ("_rows", "matcher", "_base", "pending", "mask", "__weakref__")

    def __init__(self, rows: ConstrainedRows, matcher: llguidance.LLMatcher, base: Sampler | None) -> None:
        self._rows = rows
        self.matcher = matcher
        self._base = base
        self.pending: mx.array | None = None  # the token sampled last step, not yet consumed
        self.mask: mx.array | None = None  # (1, vocab) bool, for this step

    def __call__(self, logprobs: mx.array) -> mx.array:
        if self.mask is None:
            # Start this step's forward pass now: it runs while the masks are computed on the host
            # (it needs last step's tokens, which the masks wait for too, and nothing else).
            mx.async_eval(logprobs)
            self._rows.refresh()
        assert self.mask is not None  # refresh() set every row's mask
        masked = mx.where(self.mask, logprobs, -mx.inf)
        self.mask = None
        if self._base is None:  # greedy: the argmax needs no renormalized distribution
            token = mx.argmax(masked, axis=-1)
        else:  # top-p, min-p and friends read probabilities: renormalize over the allowed tokens
            token = self._base(masked - mx.logsumexp(masked, axis=-1, keepdims=True))
        self.pending = token
        return token


class ConstrainedRows:
    """Compiles constraints for one model's tokenizer and computes the masks of its rows."""

    def __init__(self, tokenizer: Any, vocab_size: int | None) -> None:
        self._hf = getattr(tokenizer, "_tokenizer", tokenizer)
        self._vocab = vocab_size or 0  # the model's logits width; the tokenizer's when unknown
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._rows: weakref.WeakSet[RowSampler] = weakref.WeakSet()
        # For the bench: seconds waiting for last step's tokens (the sync), and computing masks.
        self.sync_seconds = 0.0
        self.mask_seconds = 0.0
        self.mask_steps = 0

    def _lltokenizer(self) -> llguidance.LLTokenizer:
        # Built on first use: a large vocabulary takes a moment, and most workers never need it.
        if self._tokenizer is None:
            self._tokenizer = llguidance.hf.from_tokenizer(self._hf, n_vocab=self._vocab or None)
            self._vocab = self._tokenizer.vocab_size
        return self._tokenizer

    def sampler(self, constraint: Constraint, base: Sampler | None, replay: Sequence[int] = ()) -> RowSampler:
        """A sampler for one row constrained by ``constraint``, its grammar already advanced by
        ``replay`` (the row's output so far). Raises :class:`ConstraintError`."""
        matcher = llguidance.LLMatcher(self._lltokenizer(), grammar_for(constraint))
        if matcher.is_error():
            raise ConstraintError(matcher.get_error())
        if replay and not matcher.consume_tokens(list(replay)):
            raise ConstraintError(f"the output so far does not match the grammar: {matcher.get_error()}")
        row = RowSampler(self, matcher, base)
        self._rows.add(row)
        return row

    def refresh(self) -> None:
        """Advance every row that sampled since its last mask, and compute their masks at once."""
        started = time.perf_counter()
        rows = [r for r in self._rows if r.mask is None]
        self._advance(rows)
        synced = time.perf_counter()
        self.sync_seconds += synced - started
        bitmask = llg_numpy.allocate_token_bitmask(len(rows), self._vocab)
        for i, row in enumerate(rows):
            llg_numpy.fill_next_token_bitmask(row.matcher, bitmask, i)
        for row, mask in zip(rows, self._unpack(bitmask), strict=True):
            row.mask = mask
        self.mask_seconds += time.perf_counter() - synced
        self.mask_steps += 1

    @staticmethod
    def _advance(rows: list[RowSampler]) -> None:
        sampled = [r for r in rows if r.pending is not None]
        if not sampled:
            return
        # One wait, for these arrays only: an op built on them now would queue behind the forward
        # pass already started, and wait for it too.
        arrays = [r.pending for r in sampled if r.pending is not None]
        mx.eval(arrays)
        tokens = [cast(int, a.item()) for a in arrays]  # int32 token ids
        for row, token in zip(sampled, tokens, strict=True):
            row.pending = None
            if not row.matcher.consume_token(int(token)) and not row.matcher.is_stopped():
                logger.warning("a constrained row sampled a token its grammar refused: %s", row.matcher.get_error())

    def _unpack(self, bitmask: np.ndarray) -> list[mx.array]:
        """(rows, words) packed int32 bits → one (1, vocab) bool array a row, each made from host
        memory: no graph op a row (a slice of one uploaded array would be one)."""
        bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, : self._vocab].astype(bool)
        return [mx.array(bits[i : i + 1]) for i in range(len(bits))]
