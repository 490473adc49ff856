"""One sampler object for every row of a generator, so mlx-lm samples the batch in one call.

mlx-lm's ``BatchGenerator`` samples a batch in one call only when every row holds the *same*
sampler object; otherwise it samples row by row (a slice, the row's op chain, then a concatenate:
dozens of small ops a step, slow on a GPU). A constrained row needs its own mask, so
:class:`MlxBatchRunner <engine_worker.runner.generator.MlxBatchRunner>` inserts every row with
its generator's one :class:`BatchSampler` and registers the row's own sampler (a shared or seeded
one, ``None`` for greedy, or a :class:`~engine_worker.runner.grammar.ConstrainedRow`) under its
uid. Each call then masks the constrained rows in one ``mx.where`` and samples the rows grouped by
their base sampler: one call per distinct base (a seeded row is a group of its own, so it draws
from its own key chain).

The sampler is called with logits only, so :class:`RowOrder` tells it which uid each row is. It
follows the generator from what the runner does and what each ``next()`` returns, not from the
generator's private attributes:

* A step samples its decoding batch first, then, in a second call, the rows whose prompt ended in
  it (a new batch that joins the decoding one at its end).
* The decoding batch's order is the order of the generated responses of the step before, less the
  finished and removed rows, then the rows whose prompt ended (``end_of_prompt``, in response order).
* Prompts are prefilled first-in first-out, so the rows whose prompt ends in a step are the first
  ones, by insertion order, whose prompt has one token left: a one-token prompt from its insert,
  a longer one once a prompt response reports ``progress == (total - 1, total)``.

Both are checked: a call's row count against the rows expected, and the rows whose prompt ended
against the rows sampled as such. A mismatch (this module out of step with the installed mlx-lm)
raises :class:`RowOrderLost`: the step fails like any failed step (its requests fail and the
generator is dropped) instead of masking the wrong rows. A call that needs no order (no
constrained row, one sampler for every row: the usual batch) is sampled as a whole without asking
for it, so it can never fail that way; the order is rebuilt from the step's responses all the same.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from engine_worker.runner.mlx_core import mx

import numpy as np
from mlx_lm.sample_utils import greedy_sampler

from engine_worker.runner.grammar import ConstrainedRow

Sampler = Callable[[mx.array], mx.array]


class RowOrderLost(RuntimeError):
    """A sampler call's rows are not the rows :class:`RowOrder` expected."""


class RowOrder:
    """The uids of the rows of each sampler call of one ``BatchGenerator``."""

    def __init__(self) -> None:
        self._decoding: list[int] = []
        # Inserted rows not decoding yet, in insertion order -> whether their prompt has one token
        # left (it ends at the generator's next prompt split).
        self._prefilling: dict[int, bool] = {}
        self._calls = 0  # sampler calls in the step under way
        self._joined: list[int] = []  # rows sampled this step as their prompt ended

    def inserted(self, uid: int, prompt_tokens: int) -> None:
        self._prefilling[uid] = prompt_tokens == 1

    def removed(self, uids: Sequence[int]) -> None:
        gone = set(uids)
        self._decoding = [u for u in self._decoding if u not in gone]
        for uid in gone:
            self._prefilling.pop(uid, None)

    def rows(self, count: int) -> list[int]:
        """The uids of the ``count`` rows of this step's next sampler call."""
        first = self._calls == 0
        self._calls += 1
        if first and self._decoding:
            if count != len(self._decoding):
                raise RowOrderLost(f"{count} rows sampled, {len(self._decoding)} decoding")
            return self._decoding
        ready = [uid for uid, last in self._prefilling.items() if last][:count]
        if len(ready) != count:
            raise RowOrderLost(f"{count} prompts ended, {len(ready)} had one token left")
        self._joined = ready
        return ready

    def stepped(self, generated: Sequence[Any], prompts: Sequence[Any]) -> None:
        """Follow one ``next()``: its generated responses and its prompt responses. The rows whose
        prompt ended are checked when the step's calls asked for their rows."""
        ended = [p.uid for p in prompts if p.end_of_prompt]
        if self._calls and ended != self._joined:
            raise RowOrderLost(f"prompts {ended} ended, {self._joined} were sampled as such")
        self._decoding = [r.uid for r in generated if r.finish_reason is None] + ended
        for uid in ended:
            del self._prefilling[uid]
        for p in prompts:
            if not p.end_of_prompt:
                done, total = p.progress
                self._prefilling[p.uid] = done == total - 1
        self._calls = 0
        self._joined = []


class BatchSampler:
    """The one sampler of a generator's rows; call :meth:`add` with each inserted row's own."""

    def __init__(self, order: RowOrder) -> None:
        self._order = order
        self._bases: dict[int, Sampler] = {}
        self._constrained: dict[int, ConstrainedRow] = {}

    def add(self, uid: int, sampler: Sampler | ConstrainedRow | None) -> None:
        """Register the row ``uid`` with its own sampler (``None``: greedy)."""
        if isinstance(sampler, ConstrainedRow):
            self._constrained[uid] = sampler
            sampler = sampler.base
        self._bases[uid] = sampler or greedy_sampler

    def drop(self, uids: Sequence[int]) -> None:
        for uid in uids:
            self._bases.pop(uid, None)
            self._constrained.pop(uid, None)

    def __call__(self, logprobs: mx.array) -> mx.array:
        if not self._constrained and len({id(b) for b in self._bases.values()}) <= 1:
            # Every row samples alike: one call, no row order needed.
            return next(iter(self._bases.values()), greedy_sampler)(logprobs)
        uids = self._order.rows(logprobs.shape[0])
        bases = [self._bases[u] for u in uids]
        rows = [self._constrained.get(u) for u in uids] if self._constrained else []
        if not any(rows):
            return _sample_grouped(logprobs, bases)
        # Start this step's forward pass now: it runs while the mask is computed on the host (it
        # needs last step's tokens, which the mask waits for too, and nothing else).
        mx.async_eval(logprobs)
        owner = next(r for r in rows if r is not None).owner
        masked = mx.where(owner.mask(rows), logprobs, -mx.inf)
        if any(r is not None and r.base is not None for r in rows):
            # Top-p, min-p and friends read probabilities: renormalize over the allowed tokens (a
            # free row's are all of them; greedy needs no renormalized distribution).
            masked = masked - mx.logsumexp(masked, axis=-1, keepdims=True)
        sampled = _sample_grouped(masked, bases)
        for i, row in enumerate(rows):
            if row is not None:
                row.pending = (sampled, i)
        return sampled


def _sample_grouped(logprobs: mx.array, bases: list[Sampler]) -> mx.array:
    """Sample each row with its sampler: one call per distinct sampler, on its rows together."""
    first = bases[0]
    if all(b is first for b in bases):
        return first(logprobs)
    groups: dict[int, tuple[Sampler, list[int]]] = {}
    for i, base in enumerate(bases):
        groups.setdefault(id(base), (base, []))[1].append(i)
    order: list[int] = []
    parts = []
    for base, rows in groups.values():
        parts.append(base(logprobs[mx.array(rows)]))
        order.extend(rows)
    return mx.concatenate(parts)[mx.array(np.argsort(order))]
