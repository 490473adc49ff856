"""Whether a step that hands out first tokens should also admit new prompts.

mlx-lm samples a sequence's first token in the step that ends its prompt and returns it from the
next step, after that step's own work. If that next step also admits prompts (merging their
caches, prefilling, splitting them into the decode batch), the first tokens wait for all of it,
and an admission step can take several decode steps' time. Holding admission for that one step
releases them a decode step later instead, and delays every waiting request by one decode step.

So the pacer holds when what the due requests gain outweighs what the queue pays::

    due * (admit_s - decode_s) > waiting * decode_s

with ``admit_s`` and ``decode_s`` running averages of this generator's measured steps. A short
queue (a burst arriving, light traffic) is held; a deep one (hundreds waiting, where throughput is
what counts) is not. Until both kinds of step have been measured, it holds: that costs one
decode step, once.
"""

from __future__ import annotations

# Weight of the newest step in the running averages: steps vary with batch size and prompt
# lengths, so the estimate follows the current load within a few steps.
_ALPHA = 0.25


class AdmissionPacer:
    """Running averages of admission and decode-only step times, and the hold decision."""

    def __init__(self) -> None:
        self.admit_s: float | None = None
        self.decode_s: float | None = None

    def record(self, seconds: float, *, prompt_work: bool) -> None:
        """One generator step took ``seconds``; ``prompt_work`` if it admitted or prefilled."""
        if prompt_work:
            self.admit_s = _average(self.admit_s, seconds)
        else:
            self.decode_s = _average(self.decode_s, seconds)

    def hold(self, *, due: int, waiting: int) -> bool:
        """Whether to admit nothing in a step where ``due`` first tokens come out and ``waiting``
        requests could otherwise start."""
        if due <= 0 or waiting <= 0:
            return False
        if self.admit_s is None or self.decode_s is None:
            return True
        return due * max(self.admit_s - self.decode_s, 0.0) > waiting * self.decode_s


def _average(previous: float | None, sample: float) -> float:
    return sample if previous is None else previous + _ALPHA * (sample - previous)
