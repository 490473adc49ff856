"""The demo model's goals as measurements: what passes, what fails, and that the loss counts
every held-out prediction once."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from demo_model.evaluate import greedy_ids, heldout_loss, sample_checks, token_spans


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return tiny_model[1]


def _checks(tokenizer, text: str) -> dict:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return sample_checks(tokenizer.decode(ids), token_spans(tokenizer, ids))


def test_plausible_code_passes(tokenizer):
    checks = _checks(tokenizer, '\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n'
                                '    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n')
    assert checks["passed"], checks
    assert checks["distinct_identifiers"] >= 5 and checks["bad_characters"] == []


@pytest.mark.parametrize(("text", "why"), [
    ("statistics returned statistics statistics statistics statistics statistics toretoretore", "repeats"),
    ("\n\n\n        \n\n\n\n    \n", "no identifiers"),
    ("x = 1\n    y = x \ufffd z", "U+FFFD"),
    ("x = 1\n    y = x\x07 + z", "control character"),
    ("self.assertEqual(self.assertEqual(self.assertEqual(self.assertEqual(", "repeats"),
])
def test_gibberish_fails(tokenizer, text, why):
    assert not _checks(tokenizer, text)["passed"], why


def test_token_spans_cover_the_decoded_text_in_order(tokenizer):
    ids = tokenizer.encode("def fibonacci(n):\n    return n", add_special_tokens=False)
    spans = token_spans(tokenizer, ids)
    assert spans[0][0] == 0 and spans[-1][1] == len(tokenizer.decode(ids))
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))


class _Uniform:
    """A model whose every prediction is uniform over ``vocab`` ids; records the targets it saw."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.positions = 0

    def __call__(self, x):
        self.positions += x.size
        return mx.zeros((*x.shape, self.vocab))


def test_heldout_loss_predicts_every_token_after_the_first_exactly_once():
    model = _Uniform(50)
    tokens = np.arange(23, dtype=np.uint16) % 50
    assert heldout_loss(model, tokens, seq=4, batch=2) == pytest.approx(math.log(50))
    assert model.positions == 22


def test_greedy_samples_have_their_length_and_no_special_token(tiny_model):
    model, tokenizer = tiny_model
    ids = greedy_ids(model, tokenizer, "class Stack:", n=12)
    assert len(ids) == 12 and not set(ids) & set(tokenizer.all_special_ids)
