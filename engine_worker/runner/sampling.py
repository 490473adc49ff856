"""Per-request samplers, logits processors and stop sequences for the batch generator.

The batch's sampler (:mod:`engine_worker.runner.batch_sampler`) samples rows together when they
hold the *same* sampler object, so :class:`SamplingFactory` hands out one shared object per
distinct setting. Greedy rows get ``None``. A seeded request gets a private sampler with its own
PRNG key, so its draws depend on its seed alone, not on its neighbours or the global key. A
constrained request gets a :class:`~engine_worker.runner.grammar.ConstrainedRow` over one of those.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from engine_worker.runner.mlx_core import mx

from mlx_lm.generate import StopSequences
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_logits_processors, make_sampler

from engine_worker.common.request import SamplingParams
from engine_worker.runner.grammar import ConstrainedRow, ConstrainedRows

Sampler = Callable[[mx.array], mx.array]


def _filters(top_p: float, top_k: int, min_p: float) -> list[Callable[[mx.array], mx.array]]:
    # Same chain and order as mlx_lm.sample_utils.make_sampler, so a seeded request samples from
    # exactly the distribution an unseeded one with the same settings does.
    out: list[Callable[[mx.array], mx.array]] = []
    if 0 < top_p < 1.0:
        out.append(lambda x: apply_top_p(x, top_p))
    if min_p != 0.0:
        out.append(lambda x: apply_min_p(x, min_p, 1))
    if top_k > 0:
        out.append(lambda x: apply_top_k(x, top_k))
    return out


def make_seeded_sampler(temperature: float, top_p: float, top_k: int, min_p: float, seed: int) -> Sampler:
    """A sampler drawing from its own key chain, started at ``seed``."""
    filters = _filters(top_p, top_k, min_p)
    inv_temp = 1.0 / temperature
    key = mx.random.key(seed)

    def sampler(logprobs: mx.array) -> mx.array:
        nonlocal key
        key, sub = mx.random.split(key)
        for f in filters:
            logprobs = f(logprobs)
        return mx.random.categorical(logprobs * inv_temp, key=sub)

    return sampler


def _guarded(processor: Callable[..., Any], on_error: Callable[[BaseException], None]) -> Callable[..., Any]:
    def guarded(tokens: mx.array, logits: mx.array) -> mx.array:
        try:
            return processor(tokens, logits)
        except Exception as exc:  # reported through on_error; the request is failed after the step
            on_error(exc)
            return logits

    return guarded


class SamplingFactory:
    """Builds the generator-side objects for a request's :class:`SamplingParams`."""

    def __init__(self, eos_token_ids: Iterable[int], constrained: ConstrainedRows | None = None) -> None:
        self._eos = tuple(sorted(set(eos_token_ids)))
        self.constrained = constrained
        self._samplers: dict[tuple[float, float, int, float], Sampler] = {}
        self._stops: dict[tuple[int, ...], StopSequences] = {}

    def sampler(self, sp: SamplingParams, replay: Sequence[int] = ()) -> Sampler | ConstrainedRow | None:
        """``None`` for greedy; a shared or seeded sampler else. A constrained request gets its
        own row over that one, its grammar advanced by ``replay`` (its output so far); raises
        ``ConstraintError`` (a ``ValueError``)."""
        base = self._base_sampler(sp)
        if sp.constraint is None:
            return base
        if self.constrained is None:
            raise ValueError("this engine cannot constrain output: it was built without a tokenizer")
        return self.constrained.row(sp.constraint, base, replay)

    def _base_sampler(self, sp: SamplingParams) -> Sampler | None:
        if sp.temperature <= 0.0:
            return None
        top_p = sp.top_p if 0 < sp.top_p < 1.0 else 0.0
        if sp.seed is not None:
            return make_seeded_sampler(sp.temperature, top_p, sp.top_k, sp.min_p, sp.seed)
        key = (float(sp.temperature), float(top_p), int(sp.top_k), float(sp.min_p))
        sampler = self._samplers.get(key)
        if sampler is None:
            sampler = make_sampler(temp=key[0], top_p=key[1], top_k=key[2], min_p=key[3])
            self._samplers[key] = sampler
        return sampler

    def logits_processors(
        self, sp: SamplingParams, on_error: Callable[[BaseException], None] | None = None
    ) -> list[Any]:
        """Logit bias, repetition/presence/frequency penalties (mlx-lm's processors) plus the
        request's own processors (none: the fast path).

        The request's own processors are caller code running inside the batch step: with
        ``on_error``, one that raises is skipped for that step and ``on_error(exc)`` is called,
        so the scheduler can fail that request alone instead of the whole batch.
        """
        procs: list[Any] = []
        rp = sp.repetition_penalty
        pp, fp, bias = sp.presence_penalty, sp.frequency_penalty, sp.logit_bias
        if (rp and rp != 1.0) or pp or fp or bias:
            procs.extend(
                make_logits_processors(
                    logit_bias=dict(bias) if bias else None,
                    repetition_penalty=rp if rp and rp != 1.0 else None,
                    presence_penalty=pp or None,
                    frequency_penalty=fp or None,
                )
            )
        if sp.logits_processors:
            if on_error is None:
                procs.extend(sp.logits_processors)
            else:
                procs.extend(_guarded(p, on_error) for p in sp.logits_processors)
        return procs

    def stop_sequences(self, sp: SamplingParams) -> StopSequences:
        """EOS ids (unless ``ignore_eos``) plus the request's ``stop_token_ids``; shared per set."""
        ids = set(sp.stop_token_ids or ())
        if not sp.ignore_eos:
            ids.update(self._eos)
        key = tuple(sorted(ids))
        stops = self._stops.get(key)
        if stops is None:
            stops = StopSequences([[t] for t in key])
            self._stops[key] = stops
        return stops


def eos_token_ids(tokenizer: Any) -> set[int]:
    """EOS ids from a tokenizer wrapper and from the tokenizer it wraps (int, list or set)."""
    ids: set[int] = set()
    for holder in (tokenizer, getattr(tokenizer, "tokenizer", None)):
        for name in ("eos_token_ids", "eos_token_id"):
            value = getattr(holder, name, None) if holder is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list | set | tuple):
                ids.update(int(v) for v in value)
    return ids
