"""The demo model's training mode, run at a toy size on the CPU: the loop learns, the schedule
reaches the compiled step, a time budget ends the run, and OUT is a model folder the service loads."""

from __future__ import annotations

import json
import math
import time

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
import pytest
from mlx.utils import tree_flatten

from demo_model.builder import ModelSpec
from demo_model.train import DEMO_SPEC, TrainConfig, Trainer, _batch, learning_rate, train
from engine_worker.runner.loader import load_model

TOY = ModelSpec(hidden=32, layers=1, heads=1, kv_heads=1, intermediate=64, vocab=3000, context=256, dtype="float16")
QUICK = TrainConfig(batch=4, seq=64, lr=1e-2, warmup_steps=5, eval_every_s=1e9, val_tokens=1024,
                    log_every_s=1e9, corpus_only=True, time_budget_s=600, final_reserve_s=0, quantize_bits=0)


def test_the_demo_spec_fits_the_repository_budget():
    params = (DEMO_SPEC.vocab * DEMO_SPEC.hidden  # tied embeddings
              + DEMO_SPEC.layers * (2 * DEMO_SPEC.hidden ** 2  # q, o
                                    + 2 * DEMO_SPEC.hidden * DEMO_SPEC.hidden // DEMO_SPEC.heads * DEMO_SPEC.kv_heads
                                    + 3 * DEMO_SPEC.hidden * DEMO_SPEC.intermediate))
    group = TrainConfig().quantize_group_size
    assert TrainConfig().quantize_bits == 8 and params * (1 + 4 / group) < 9.5e6  # a byte, and fp16 scale and bias per group


def test_learning_rate_warms_up_then_follows_a_cosine_to_its_floor():
    cfg = TrainConfig(lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    assert learning_rate(cfg, 0, 0.0) == pytest.approx(1e-4)
    assert learning_rate(cfg, 9, 0.0) == pytest.approx(1e-3)
    assert learning_rate(cfg, 100, 0.5) == pytest.approx(0.55e-3)
    assert learning_rate(cfg, 100, 1.0) == pytest.approx(1e-4)
    assert learning_rate(cfg, 100, 7.0) == pytest.approx(1e-4)


def _weights(trainer: Trainer) -> np.ndarray:
    return np.concatenate([np.array(v.astype(mx.float32)).ravel() for _, v in tree_flatten(trainer.model.parameters())])


def test_a_learning_rate_set_between_steps_reaches_the_compiled_step(tmp_path):
    trainer = Trainer(tmp_path / "m", TOY, QUICK)
    trainer.prepare()
    trainer.build()
    rng = np.random.default_rng(0)
    trainer.optimizer.learning_rate = 1e-2
    trainer._step(rng).item()
    before = _weights(trainer)
    trainer.optimizer.learning_rate = 0.0
    trainer._step(rng).item()
    assert np.array_equal(before, _weights(trainer))
    trainer.optimizer.learning_rate = 1e-2
    trainer._step(rng).item()
    assert not np.array_equal(before, _weights(trainer))


def test_loss_falls_over_a_few_dozen_steps_and_out_is_a_loadable_model(tmp_path):
    out = tmp_path / "m"
    log = train(out, TOY, TrainConfig(**{**QUICK.__dict__, "max_steps": 40}), evaluate_after=False)
    run = log["training"]
    assert run["steps"] == 40
    assert run["last_train_loss"] < run["first_train_loss"] - 1.0
    assert math.isfinite(run["best_val_loss"]) and run["best_val_loss"] < math.log(3000)
    assert json.loads((out / "eval.json").read_text())["training"] == run
    saved = mx.load(str(out / "model.safetensors"))
    assert {v.dtype for v in saved.values()} == {mx.float16}
    model, tokenizer = load_model(out)
    assert model.args.hidden_size == 32 and tokenizer.encode("def f():")[0] == tokenizer.bos_token_id


def test_a_time_budget_ends_the_run_with_weights_saved(tmp_path):
    out = tmp_path / "m"
    started = time.monotonic()
    log = train(out, TOY, TrainConfig(**{**QUICK.__dict__, "time_budget_s": 8.0}), evaluate_after=False)
    assert time.monotonic() - started < 8.0 + 20  # the deadline, plus the last step and one val pass
    assert log["training"]["steps"] > 0 and (out / "model.safetensors").exists()
    assert sorted(f.name for f in out.iterdir()) == [
        "chat_template.jinja", "config.json", "eval.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


def test_quantize_bits_ships_quantized_weights_the_service_loads(tmp_path):
    out = tmp_path / "m"
    spec = ModelSpec(hidden=64, layers=1, heads=1, kv_heads=1, intermediate=128, vocab=3000, context=256,
                     dtype="float16")
    cfg = TrainConfig(**{**QUICK.__dict__, "max_steps": 3, "quantize_bits": 8})
    train(out, spec, cfg, evaluate_after=False)
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"] == {"group_size": 64, "bits": 8, "mode": "affine"}
    saved = mx.load(str(out / "model.safetensors"))
    assert saved["model.layers.0.mlp.down_proj.weight"].dtype == mx.uint32
    assert saved["model.embed_tokens.scales"].dtype == mx.float16
    packed, _ = mlx_lm.load(str(out))
    assert type(packed.model.layers[0].mlp.down_proj).__name__ == "QuantizedLinear"
    model, tokenizer = load_model(out)  # dequantized to fp32 on the CPU
    ids = mx.array([tokenizer.encode("def f():")])
    assert mx.allclose(model(ids), packed(ids), atol=1e-2).item()


def test_a_run_continues_from_another_runs_quantized_folder(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    base = {**QUICK.__dict__, "quantize_bits": 8, "quantize_group_size": 32}
    train(first, TOY, TrainConfig(**{**base, "max_steps": 40}), evaluate_after=False)
    assert "model.layers.0.mlp.up_proj.scales" in mx.load(str(first / "model.safetensors"))  # quantized
    trained = load_model(first)[0]

    continued = Trainer(second, TOY, TrainConfig(**{**base, "init_from": str(first)}))
    continued.prepare()
    continued.build()
    fresh = Trainer(tmp_path / "fresh", TOY, TrainConfig(**base))
    fresh.prepare()
    fresh.build()
    rng = np.random.default_rng(1)
    x, y = (mx.array(a) for a in _batch(continued.train_stream, base["batch"], base["seq"], rng))

    def loss(model: nn.Module) -> float:
        return nn.losses.cross_entropy(model(x).astype(mx.float32), y, reduction="mean").item()

    assert loss(continued.model) == pytest.approx(loss(trained), abs=0.02)
    assert loss(continued.model) < loss(fresh.model) - 0.5


def test_a_run_refuses_to_continue_from_its_own_folder_or_another_spec(tmp_path):
    out = tmp_path / "m"
    train(out, TOY, TrainConfig(**{**QUICK.__dict__, "max_steps": 2}), evaluate_after=False)
    with pytest.raises(ValueError, match="another folder"):
        Trainer(out, TOY, TrainConfig(**{**QUICK.__dict__, "init_from": str(out)}))
    other = Trainer(tmp_path / "wider", ModelSpec(**{**TOY.__dict__, "hidden": 64}),
                    TrainConfig(**{**QUICK.__dict__, "init_from": str(out)}))
    other.prepare()
    with pytest.raises(ValueError, match="not hold a model of this spec"):
        other.build()

