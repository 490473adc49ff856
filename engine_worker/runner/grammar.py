"""Constrained rows in the batch: each one samples only tokens its grammar allows.

A constrained request is inserted with a :class:`ConstrainedRow` (its grammar matcher and its base
sampling settings). The batch's one sampler (:class:`~engine_worker.runner.batch_sampler.BatchSampler`)
asks :meth:`ConstrainedRows.mask` for one ``(rows, vocab)`` mask per call: it evaluates the tokens
the constrained rows sampled last step (one sync; mlx already computed them asynchronously),
advances each row's matcher by its token, and fills one bitmask for the lot; free rows get
all-true rows.

A row's matcher starts from its grammar and the tokens the row already produced (``replay``), so a
preempted request that runs again continues in the same grammar state.
"""

from __future__ import annotations

import logging
import time
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


class ConstrainedRow:
    """One constrained row: its grammar matcher, its base sampler (``None``: greedy), and the token
    it sampled last step that the matcher has not consumed yet."""

    __slots__ = ("owner", "matcher", "base", "pending")

    def __init__(self, owner: ConstrainedRows, matcher: llguidance.LLMatcher, base: Sampler | None) -> None:
        self.owner = owner
        self.matcher = matcher
        self.base = base
        # (the array a sampler call returned, this row's index in it), until the next mask.
        self.pending: tuple[mx.array, int] | None = None


class ConstrainedRows:
    """Compiles constraints for one model's tokenizer and computes the masks of its rows."""

    def __init__(self, tokenizer: Any, vocab_size: int | None) -> None:
        self._hf = getattr(tokenizer, "_tokenizer", tokenizer)
        self._vocab = vocab_size or 0  # the model's logits width; the tokenizer's when unknown
        self._tokenizer: llguidance.LLTokenizer | None = None
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

    def row(self, constraint: Constraint, base: Sampler | None, replay: Sequence[int] = ()) -> ConstrainedRow:
        """A row constrained by ``constraint``, its grammar already advanced by ``replay`` (the
        row's output so far), sampling with ``base`` over the allowed tokens. Raises
        :class:`ConstraintError`."""
        matcher = llguidance.LLMatcher(self._lltokenizer(), grammar_for(constraint))
        if matcher.is_error():
            raise ConstraintError(matcher.get_error())
        if replay and not matcher.consume_tokens(list(replay)):
            raise ConstraintError(f"the output so far does not match the grammar: {matcher.get_error()}")
        return ConstrainedRow(self, matcher, base)

    def mask(self, rows: Sequence[ConstrainedRow | None]) -> mx.array:
        """The ``(len(rows), vocab)`` bool mask of one sampler call: each constrained row's allowed
        tokens, after its matcher consumed the token it sampled last; all true for a free row
        (``None``)."""
        started = time.perf_counter()
        constrained = [r for r in rows if r is not None]
        self._advance(constrained)
        synced = time.perf_counter()
        self.sync_seconds += synced - started
        bitmask = llg_numpy.allocate_token_bitmask(len(constrained), self._vocab)
        for i, row in enumerate(constrained):
            llg_numpy.fill_next_token_bitmask(row.matcher, bitmask, i)
        bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, : self._vocab].astype(bool)
        # Only the constrained rows and one all-true row go up; one gather spreads them over the
        # call's rows (a free row reads the all-true one).
        table = np.concatenate([bits, np.ones((1, self._vocab), dtype=bool)])
        which, k = [], 0
        for r in rows:
            which.append(k if r is not None else len(constrained))
            k += r is not None
        mask = mx.array(table)[mx.array(which)]
        self.mask_seconds += time.perf_counter() - synced
        self.mask_steps += 1
        return mask

    @staticmethod
    def _advance(rows: list[ConstrainedRow]) -> None:
        sampled = [r for r in rows if r.pending is not None]
        if not sampled:
            return
        # One wait, for these arrays only (a sampler call's, last step; at most two): an op built
        # on them now would queue behind the forward pass already started, and wait for it too.
        arrays = {id(r.pending[0]): r.pending[0] for r in sampled if r.pending is not None}
        mx.eval(list(arrays.values()))
        tokens = {key: cast(list[int], a.tolist()) for key, a in arrays.items()}  # int token ids
        for row in sampled:
            assert row.pending is not None
            array, index = row.pending
            row.pending = None
            if not row.matcher.consume_token(tokens[id(array)][index]) and not row.matcher.is_stopped():
                logger.warning("a constrained row sampled a token its grammar refused: %s", row.matcher.get_error())
