"""Greedy decoding takes the model's top token even where bfloat16 log probabilities tie."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.generate import StopSequences

from engine_worker.common.config import SchedulerConfig
from engine_worker.runner.float_logits import Float32Logits
from engine_worker.runner.generator import MlxBatchRunner
from tests.engine_worker.engine_helpers import prompt_ids

TOP = 100  # above every special token and byte of the tiny vocabulary's lowest ids


class _FlatBfloat16Logits:
    """The tiny model (its caches are real) with bfloat16 logits that are all 0 but TOP's, 0.01
    higher: as flat as a random-weight model's. Normalized in bfloat16 (log 3000 = 8.006, stored
    in steps of 0.0625) every log probability reads -8.0, and the lowest id would win."""

    def __init__(self, model: Any) -> None:
        self._model = model

    def __call__(self, inputs: mx.array, cache: Any = None) -> mx.array:
        logits = self._model(inputs, cache=cache)
        top = (mx.arange(logits.shape[-1]) == TOP).astype(mx.float32) * 0.01
        return mx.broadcast_to(top, logits.shape).astype(mx.bfloat16)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def _greedy_first_token(model: Any, tokenizer: Any) -> int:
    runner = MlxBatchRunner(model, SchedulerConfig())
    try:
        runner.insert(prompt_ids(tokenizer, 12), max_tokens=1, cache=None, all_tokens=None, sampler=None,
                      logits_processors=[], stop_sequences=StopSequences([]))
        for _ in range(10):
            generated = runner.step().generated
            if generated:
                return int(generated[0].token)
    finally:
        runner.close()
    raise AssertionError("no token in 10 steps")


def test_greedy_takes_the_top_logit_where_bfloat16_log_probabilities_tie(tiny_model):
    """m300 (316M, random weights, bf16 on the GPU) answered one of peer_bench's 512 one-token
    chat requests with <|eos|> (id 2), an empty answer, though its top logit was another token:
    about 2,000 ids tied in bfloat16 and the lowest won."""
    model, tokenizer = tiny_model
    flat = _FlatBfloat16Logits(model)
    logits = flat(mx.array([prompt_ids(tokenizer, 12)]))[0, -1]
    assert mx.argmax(logits - mx.logsumexp(logits)).item() != TOP  # the tie this guards against
    assert _greedy_first_token(flat, tokenizer) == TOP


def test_the_wrapped_model_keeps_its_attributes_and_float32_logits(tiny_model):
    model, tokenizer = tiny_model
    wrapped = Float32Logits(model)
    assert wrapped.layers is model.layers and wrapped.args is model.args
    out = wrapped(mx.array([prompt_ids(tokenizer, 4)]))
    assert out.dtype == mx.float32
    assert mx.array_equal(out, model(mx.array([prompt_ids(tokenizer, 4)]))).item()
