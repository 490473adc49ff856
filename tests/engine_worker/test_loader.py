"""Model loading for the engine: fp32 on the CPU, context length from the config."""

from __future__ import annotations

import shutil

import mlx.core as mx
from mlx_lm.utils import save_model

from engine_worker.loader import context_length, load_model, vocab_size
from engine_worker.memory import device_label


def test_load_model_casts_a_bf16_checkpoint_to_fp32_on_cpu_and_reads_the_context(tiny_model_path, tmp_path):
    bf16_dir = tmp_path / "bf16"
    shutil.copytree(tiny_model_path, bf16_dir, ignore=shutil.ignore_patterns("model*.safetensors*"))
    model, _ = load_model(tiny_model_path, dtype="bfloat16")
    assert model.model.embed_tokens.weight.dtype == mx.bfloat16
    save_model(bf16_dir, model)

    model, tokenizer = load_model(bf16_dir)
    if device_label() == "cpu":
        assert model.model.embed_tokens.weight.dtype == mx.float32
    assert context_length(model) == 4096
    assert vocab_size(model) == 3000
    assert set(tokenizer.eos_token_ids) == {2, 4}
