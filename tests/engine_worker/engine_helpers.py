"""Helpers shared by the engine tests (not a test module)."""

from __future__ import annotations

from typing import Any

from mlx_lm import stream_generate

from engine_worker.common.request import Request, RequestOutput, SamplingParams
from engine_worker.sched.scheduler import Scheduler

GREEDY = dict(temperature=0.0)


def greedy(max_tokens: int, **kw: Any) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)


def solo_tokens(model: Any, tokenizer: Any, prompt: list[int], max_tokens: int) -> list[int]:
    """What mlx_lm produces for this prompt alone (greedy; EOS ends it and is not yielded)."""
    out = []
    for r in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens):
        if r.finish_reason == "stop":
            break
        out.append(r.token)
    return out


def run_scheduler(
    scheduler: Scheduler,
    arrivals: dict[int, list[Request]] | None = None,
    max_steps: int = 10_000,
    on_step: Any = None,
) -> dict[str, list[RequestOutput]]:
    """Step until idle; ``arrivals[k]`` are added before step k. Returns outputs per request."""
    arrivals = dict(arrivals or {})
    outputs: dict[str, list[RequestOutput]] = {}
    step = 0
    while arrivals or scheduler.has_requests():
        for request in arrivals.pop(step, []):
            scheduler.add_request(request)
        result = scheduler.step()
        for out in result.outputs:
            outputs.setdefault(out.request_id, []).append(out)
        if on_step is not None:
            on_step(step, result)
        step += 1
        assert step < max_steps, "scheduler did not finish"
    return outputs


def final(outputs: list[RequestOutput]) -> RequestOutput:
    assert outputs[-1].finished
    return outputs[-1]


def prompt_ids(tokenizer: Any, n: int, seed_text: str = "def f(x):\n    return x + 1\n") -> list[int]:
    """A prompt of exactly ``n`` tokens, built from repeating text."""
    ids: list[int] = []
    text = seed_text
    while len(ids) < n:
        ids = tokenizer.encode(text)
        text += seed_text
    return ids[:n]


def force_tokens(tokens: list[int]):
    """A logits processor that makes the request emit ``tokens`` in order (then anything)."""
    import mlx.core as mx

    state = {"i": 0}

    def processor(_context: Any, logits: mx.array) -> mx.array:
        i = state["i"]
        state["i"] += 1
        if i >= len(tokens):
            return logits
        mask = mx.full(logits.shape, -1e9, dtype=logits.dtype)
        mask[..., tokens[i]] = 0.0
        return logits + mask

    return processor
