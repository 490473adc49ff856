"""Helpers for the prefix-cache tests: prompts from the tiny model's corpus, a prefill that
builds a real per-layer cache, and greedy generation through mlx_lm (the cold reference)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

# Real, non-periodic text (the tiny model's own training corpus), so prompts of different
# variants really diverge.
CORPUS = Path(__file__).resolve().parents[3] / "demo_model" / "corpus.txt"


@pytest.fixture(scope="session")
def prompts(tiny_model) -> Callable[[int, int], list[int]]:
    """``prompts(n, variant)``: an n-token prompt; different variants diverge from token 0."""
    _model, tokenizer = tiny_model
    base = tokenizer.encode(CORPUS.read_text(encoding="utf-8")[:40_000])

    def make(n: int, variant: int = 0) -> list[int]:
        start = (variant * 211) % (len(base) - n)
        return list(base[start : start + n])

    return make


@pytest.fixture(scope="session")
def prefill(tiny_model) -> Callable[[list[int]], list]:
    """A real per-layer cache holding ``tokens`` (one forward pass)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    model, _ = tiny_model

    def run(tokens: list[int]) -> list:
        cache = make_prompt_cache(model)
        model(mx.array([tokens]), cache=cache)
        mx.eval([c.keys for c in cache])
        return cache

    return run


@pytest.fixture(scope="session")
def greedy(tiny_model) -> Callable[..., list[int]]:
    """Greedy tokens from ``mlx_lm.stream_generate`` (EOS can stop it early, equally for both runs)."""
    from mlx_lm import stream_generate

    model, tokenizer = tiny_model

    def run(tokens: list[int], cache: list | None = None, max_tokens: int = 10) -> list[int]:
        return [r.token for r in stream_generate(model, tokenizer, tokens, max_tokens=max_tokens,
                                                 prompt_cache=cache)]

    return run


@pytest.fixture
def store_evals(monkeypatch) -> list[int]:
    """Count the ``mx.eval`` calls the cache back ends make (a device sync each): the list gets
    one entry per call, the number of arrays it evaluated."""
    import mlx.core as mx

    from engine_worker.cache import kv, paged_cache

    calls: list[int] = []

    class CountingMx:
        def __getattr__(self, name: str):
            return getattr(mx, name)

        @staticmethod
        def eval(*arrays):
            calls.append(sum(len(a) if isinstance(a, list) else 1 for a in arrays))
            return mx.eval(*arrays)

    for module in (kv, paged_cache):
        monkeypatch.setattr(module, "mx", CountingMx())
    return calls
