"""Log probabilities of generated tokens, for requests that ask (``SamplingParams.logprobs``).

mlx-lm's generator hands each step's token with the row of log probabilities it was drawn from
(the log-softmax of the logits after the request's processors, before temperature). For each
asking request the scheduler takes the chosen token's value and, with ``logprobs = k``, the ``k``
most likely tokens, in one evaluation per step for all of them. Requests that do not ask cost
nothing.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from engine_worker.runner.mlx_core import mx

MAX_TOP_LOGPROBS = 20
# What a log probability that is not a finite number (an overflowed logit) is reported as: JSON
# and PostgreSQL's jsonb have no -Infinity or NaN. OpenAI reports -9999.0 for "impossible" too.
FLOOR = -9999.0


class TokenLogprob(NamedTuple):
    """One generated token's log probability and its most likely alternatives, best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(rows: list[tuple[mx.array, int, int]]) -> list[TokenLogprob]:
    """For each ``(logprobs row, chosen token, k)``: the chosen token's log probability and the
    ``k`` best (token, log probability) pairs. One ``mx.eval`` for the whole list."""
    if not rows:
        return []
    chosen: list[Any] = []
    tops: list[tuple[Any, Any] | None] = []
    for row, token, k in rows:
        chosen.append(row[token])
        if k > 0:
            ids = mx.argpartition(-row, kth=k - 1)[:k]
            tops.append((ids, row[ids]))
        else:
            tops.append(None)
    mx.eval(chosen, [t for pair in tops if pair is not None for t in pair])
    out = []
    for (_, token, _), value, top in zip(rows, chosen, tops, strict=True):
        pairs: tuple[tuple[int, float], ...] = ()
        if top is not None:
            pairs = tuple(sorted(((int(t), _finite(lp)) for t, lp in zip(top[0].tolist(), top[1].tolist(), strict=True)),
                                 key=lambda p: -p[1]))
        out.append(TokenLogprob(int(token), _finite(value.item()), pairs))
    return out


def _finite(value: float) -> float:
    return value if math.isfinite(value) else FLOOR
