"""The shipped demo model (demo_model/demo) meets its goals on Python it never saw.

The held-out modules are this machine's standard library's test split (code_data.split_of): the
GPU host that trained the weights left the same modules out, whatever its Python version.
"""

from __future__ import annotations

import json

import pytest

from demo_model import DEMO_MODEL_DIR
from demo_model.evaluate import MAX_HELDOUT_LOSS, evaluate

pytestmark = [
    pytest.mark.skipif(not (DEMO_MODEL_DIR / "model.safetensors").exists(),
                       reason="no trained weights in demo_model/demo yet: train them with "
                              "python -m demo_model.train (docs/models.md)"),
    pytest.mark.timeout(600),
]


def test_the_demo_model_is_small_8_bit_and_shares_the_test_models_token_ids(tiny_model_path):
    files = [f for f in DEMO_MODEL_DIR.iterdir() if f.is_file()]
    assert sum(f.stat().st_size for f in files) <= 10.5e6
    config = json.loads((DEMO_MODEL_DIR / "config.json").read_text())
    assert config["quantization"]["bits"] == 8 and config["vocab_size"] == 3000
    demo = json.loads((DEMO_MODEL_DIR / "tokenizer.json").read_text())["model"]
    tiny = json.loads((tiny_model_path / "tokenizer.json").read_text())["model"]
    assert (demo["vocab"], demo["merges"]) == (tiny["vocab"], tiny["merges"])


@pytest.fixture(scope="module")
def summary() -> dict:
    return evaluate(DEMO_MODEL_DIR, max_tokens=32_768)


def test_the_demo_models_loss_on_python_it_never_saw_meets_its_goal(summary):
    assert summary["heldout"]["loss"] <= MAX_HELDOUT_LOSS, summary["heldout"]


def test_every_greedy_sample_of_the_demo_model_holds_identifiers_and_no_bad_characters(summary):
    for sample in summary["samples"]:
        assert sample["distinct_identifiers"] >= 1 and not sample["bad_characters"], sample


def test_no_greedy_sample_of_the_demo_model_repeats_one_identifier_too_often(summary):
    for sample in summary["samples"]:
        assert sample["passed"], sample
