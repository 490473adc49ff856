"""Model loading for the engine: fp32 on the CPU, context length from the config, mlx-community's
quantized layout."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import mlx_lm
import numpy as np
from mlx_lm import convert
from mlx_lm.utils import save_model

from engine_worker.common.request import SamplingParams
from engine_worker.engine_core import EngineCore
from engine_worker.runner.device_memory import device_label
from engine_worker.runner.loader import _is_quantized, context_length, load_model, vocab_size


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


def test_a_4bit_folder_in_the_mlx_community_layout_loads_and_serves(tiny_model_path, tmp_path):
    """What docs/models.md's "A real model" serves: a folder as mlx_lm.convert writes it (and as
    mlx-community publishes them): 4-bit weights with bf16 scales, config.json with its
    quantization, the tokenizer files."""
    folder = tmp_path / "tiny-4bit"
    convert(str(tiny_model_path), mlx_path=str(folder), quantize=True, q_bits=4, q_group_size=64, dtype="bfloat16")
    config = json.loads((folder / "config.json").read_text())
    assert config["quantization"]["bits"] == 4 and config["quantization"]["group_size"] == 64
    assert {"tokenizer.json", "tokenizer_config.json", "model.safetensors"} <= {f.name for f in folder.iterdir()}

    model, tokenizer = load_model(folder)
    if device_label() == "cpu":
        assert not _is_quantized(model) and model.model.layers[0].mlp.up_proj.weight.dtype == mx.float32
    as_shipped, _ = mlx_lm.load(str(folder))
    assert _is_quantized(as_shipped)
    x = mx.array([tokenizer.encode("def fibonacci(n):")])
    ours, theirs = np.array(model(x).astype(mx.float32)), np.array(as_shipped(x).astype(mx.float32))
    assert np.corrcoef(ours.ravel(), theirs.ravel())[0, 1] > 0.99  # the same model, up to bf16 rounding

    with EngineCore(model, tokenizer) as engine:
        [out] = engine.generate_batch_sync(["def fibonacci(n):"], SamplingParams(max_tokens=8, temperature=0.0,
                                                                                ignore_eos=True))
    assert (out.finish_reason, out.completion_tokens) == ("length", 8)
