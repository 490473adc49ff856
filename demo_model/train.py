"""Train the demo code model with mlx, within a time budget, into an mlx-lm model folder.

    python -m demo_model.train OUT [--time-budget-s 300] [--site-packages-mb 0] ...

The tokenizer is the test model's (byte-level BPE trained on the shipped ``corpus.txt``, so ids
are the same everywhere); the text is the corpus plus this Python's standard library (and, with
``--site-packages-mb``, some of its third-party packages), split by module path
(:mod:`demo_model.code_data`): the model never trains on a val or test module.

Next-token cross-entropy on random windows of the training stream, AdamW (no decay on norms),
linear warm-up then cosine decay over the *time* budget, so the schedule ends when time does. The
step is compiled (``mx.compile``). Every ``--eval-every-s`` the val loss is measured and, when it is
the best so far, the weights are written to ``OUT/model.safetensors`` (fp16, atomically): OUT is a
loadable model folder from the first checkpoint on, so a run killed at a time limit leaves the best
weights so far. The budget covers the whole run, including the final evaluation on the test split
(:mod:`demo_model.evaluate`), which writes ``OUT/eval.json``. ``--init-from DIR``
continues from the weights of an earlier run's folder (a new schedule and optimizer state), so a
longer training can be run as several time-limited ones.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from engine_worker.runner.mlx_core import mx

import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import llama
from mlx_lm.utils import quantize_model

from demo_model import code_data
from demo_model.builder import ModelSpec, model_config, save_tokenizer, train_tokenizer

logger = logging.getLogger(__name__)

# 8.8M parameters, shipped 8-bit (mlx-lm's affine quantization, group 64): 9.4 MB, under the ~10 MB
# the repository ships with the tokenizer. The vocabulary stays the test model's 3,000: a larger one
# would spend the budget on embeddings (vocab x hidden) and change the token ids the tests share.
DEMO_SPEC = ModelSpec(hidden=384, layers=6, heads=6, kv_heads=2, intermediate=768, vocab=3000,
                      context=2048, dtype="float16")


@dataclass(frozen=True)
class TrainConfig:
    time_budget_s: float = 300.0
    max_steps: int = 0  # 0: until the time budget is spent
    batch: int = 128
    seq: int = 512
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 200
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every_s: float = 20.0
    val_tokens: int = 65_536
    final_reserve_s: float = 25.0  # kept for the final evaluation and writing
    log_every_s: float = 10.0
    site_packages_mb: float = 0.0
    corpus_only: bool = False  # the shipped corpus alone, without the standard library (quick runs)
    eval_max_tokens: int = 0  # held-out tokens per source in the final evaluation; 0: all
    quantize_bits: int = 8  # mlx-lm's affine quantization of the shipped weights; 0: the spec's dtype
    quantize_group_size: int = 64
    init_from: str = ""  # a model folder of the same spec to continue from (quantized weights are dequantized)


def learning_rate(cfg: TrainConfig, step: int, progress: float) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine from ``lr`` to ``lr * min_lr_ratio`` as
    ``progress`` (the spent share of the budget) goes from 0 to 1."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))
    return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine)


def init_model(spec: ModelSpec, config: dict) -> Any:
    """An fp32 Llama with GPT-2's initialization: N(0, 0.02), residual projections scaled by
    1/sqrt(2 * layers) so the residual stream's variance does not grow with depth."""
    mx.random.seed(spec.seed)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    residual = 0.02 / math.sqrt(2 * spec.layers)
    new = []
    for name, p in tree_flatten(model.parameters()):
        if p.ndim == 2:
            std = residual if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            new.append((name, mx.random.normal(p.shape) * std))
    model.update(tree_unflatten(new))
    mx.eval(model.parameters())
    return model


def _weights_of(model_dir: Path, like: Any) -> list[tuple[str, Any]]:
    """The weights of the model folder ``model_dir`` (dequantized when quantized) in fp32, as
    ``like``'s parameters; :class:`ValueError` when a name or shape differs."""
    from mlx_lm.utils import dequantize_model, load_model

    loaded, _ = load_model(model_dir)
    found = dict(tree_flatten(dequantize_model(loaded).parameters()))
    expected = dict(tree_flatten(like.parameters()))
    if {k: v.shape for k, v in found.items()} != {k: v.shape for k, v in expected.items()}:
        raise ValueError(f"{model_dir} does not hold a model of this spec")
    return [(k, v.astype(mx.float32)) for k, v in found.items()]


def _batch(stream: np.ndarray, batch: int, seq: int, rng: np.random.Generator) -> Any:
    starts = rng.integers(0, len(stream) - seq - 1, size=batch)
    rows = stream[starts[:, None] + np.arange(seq + 1)].astype(np.int32)
    return rows[:, :-1], rows[:, 1:]


class Trainer:
    """One training run: data, model, optimizer and the compiled step."""

    def __init__(self, out: Path, spec: ModelSpec, cfg: TrainConfig) -> None:
        if cfg.init_from and Path(cfg.init_from).resolve() == out.resolve():
            raise ValueError("init_from must be another folder than OUT (OUT's files are rewritten first)")
        self.out, self.spec, self.cfg = out, spec, cfg
        self.t0 = time.monotonic()
        self.deadline = self.t0 + cfg.time_budget_s - cfg.final_reserve_s
        self.log: dict[str, Any] = {"spec": asdict(spec), "config": asdict(cfg), "progress": []}
        self.losses: list[float] = []
        self.best, self.best_step = math.inf, 0

    def prepare(self) -> None:
        """Tokenizer, data and the model folder's files (all but the weights)."""
        tok = train_tokenizer(self.spec.vocab)
        self.out.mkdir(parents=True, exist_ok=True)
        ids = save_tokenizer(tok, self.out, self.spec.context)
        self.config = model_config(self.spec, ids)
        (self.out / "config.json").write_text(json.dumps(self.config, indent=2) + "\n")
        self.docs = code_data.gather(stdlib=not self.cfg.corpus_only, site_packages_mb=self.cfg.site_packages_mb)
        splits = code_data.by_split(self.docs)
        bos, eos = ids["<|bos|>"], ids["<|eos|>"]
        self.train_stream = code_data.encode_documents(tok, splits["train"], bos, eos)
        # The val sample: the first val_tokens of the val modules in hash order, a mix of sources.
        val_docs = sorted(splits["val"], key=lambda d: code_data.key_hash(d.key))
        self.val_stream = code_data.encode_documents(tok, val_docs, bos, eos)[: self.cfg.val_tokens + 1]
        data = {name: {"documents": len(d), "bytes": sum(len(x.text) for x in d)} for name, d in splits.items()}
        if len(self.val_stream) < 2:
            # No val module (the corpus alone): hold out the training stream's tail instead.
            cut = len(self.train_stream) - min(self.cfg.val_tokens + 1, len(self.train_stream) // 10)
            self.train_stream, self.val_stream = self.train_stream[:cut], self.train_stream[cut:]
            data["val"]["from"] = "the tail of the training stream"
        data["train"]["tokens"] = int(len(self.train_stream))
        data["val"]["tokens_used"] = int(len(self.val_stream))
        self.log["data"] = data
        _say(f"data: {json.dumps(data)} ({time.monotonic() - self.t0:.1f}s)")

    def build(self) -> None:
        """The model, its optimizer (AdamW, no weight decay on norms) and the compiled step."""
        self.model = init_model(self.spec, self.config)
        if self.cfg.init_from:
            self.model.update(tree_unflatten(_weights_of(Path(self.cfg.init_from), self.model)))
            mx.eval(self.model.parameters())
        n_params = sum(p.size for _, p in tree_flatten(self.model.parameters()))
        self.log["parameters"] = n_params
        decayed = optim.AdamW(self.cfg.lr, betas=[0.9, 0.95], weight_decay=self.cfg.weight_decay)
        plain = optim.AdamW(self.cfg.lr, betas=[0.9, 0.95], weight_decay=0.0)
        self.optimizer = optim.MultiOptimizer([decayed, plain], [lambda _name, p: p.ndim == 2])
        self.optimizer.init(self.model.trainable_parameters())

        def loss_fn(model: Any, x: Any, y: Any) -> Any:
            return nn.losses.cross_entropy(model(x).astype(mx.float32), y, reduction="mean")

        loss_and_grad = nn.value_and_grad(self.model, loss_fn)
        state = [self.model.state, self.optimizer.state]

        @partial(mx.compile, inputs=state, outputs=state)
        def step(x: Any, y: Any) -> Any:
            loss, grads = loss_and_grad(self.model, x, y)
            grads, _ = optim.clip_grad_norm(grads, self.cfg.grad_clip)
            self.optimizer.update(self.model, grads)
            return loss

        self.step_fn = step
        self.state = state
        _say(f"model: {n_params:,} parameters; mlx {mx.__version__} on {mx.default_device()}, "
             f"Python {sys.version.split()[0]}")

    def val_loss(self) -> float:
        from demo_model.evaluate import heldout_loss

        return heldout_loss(self.model, self.val_stream, seq=self.cfg.seq, batch=max(self.cfg.batch // 4, 1))

    def save_weights(self) -> None:
        """Write the current weights in the spec's dtype (quantized with ``quantize_bits``) to
        ``OUT/model.safetensors`` atomically, and the config that loads them."""
        dtype = getattr(mx, self.spec.dtype)
        weights = [(k, v.astype(dtype)) for k, v in tree_flatten(self.model.parameters())]
        config = self.config
        if self.cfg.quantize_bits:
            copy = llama.Model(llama.ModelArgs.from_dict(self.config))
            copy.update(tree_unflatten(weights))
            copy, config = quantize_model(copy, self.config, self.cfg.quantize_group_size, self.cfg.quantize_bits)
            weights = tree_flatten(copy.parameters())
        tmp = self.out / ".model.tmp.safetensors"  # a leftover never matches mlx-lm's model*.safetensors
        mx.save_safetensors(str(tmp), dict(weights), metadata={"format": "mlx"})
        os.replace(tmp, self.out / "model.safetensors")
        (self.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    def run(self) -> dict[str, Any]:
        """Train until the budget (or ``max_steps``) is spent; the best-by-val weights are in OUT."""
        cfg = self.cfg
        rng = np.random.default_rng(self.spec.seed)  # one seed for weights and batches
        start = time.monotonic()
        span = max(self.deadline - start, 1e-9)
        step, pending = 0, None
        last_eval = start
        last_log = (start, 0)
        while True:
            now = time.monotonic()
            done = now >= self.deadline or (cfg.max_steps and step >= cfg.max_steps)
            if done or now - last_eval >= cfg.eval_every_s:
                self._collect(pending)
                pending = None
                self._evaluate(step, now - start)
                last_eval = time.monotonic()
                if done:
                    break
            progress = max((now - start) / span, step / cfg.max_steps if cfg.max_steps else 0.0)
            lr = learning_rate(cfg, step, progress)
            self.optimizer.learning_rate = lr
            loss = self._step(rng)
            self._collect(pending)  # the previous step's loss: the device stays one step ahead
            pending = loss
            step += 1
            if now - last_log[0] >= cfg.log_every_s:
                rate = (step - last_log[1]) * cfg.batch * cfg.seq / max(now - last_log[0], 1e-9)
                _say(f"step {step} train {self._recent_loss():.3f} lr {lr:.2e} {rate:,.0f} tok/s "
                     f"{now - self.t0:.0f}s")
                last_log = (now, step)
        return self._summary(step, time.monotonic() - start)

    def _step(self, rng: np.random.Generator) -> Any:
        x, y = _batch(self.train_stream, self.cfg.batch, self.cfg.seq, rng)
        loss = self.step_fn(mx.array(x), mx.array(y))
        mx.async_eval(loss, self.state)
        return loss

    def _collect(self, loss: Any) -> None:
        if loss is not None:
            self.losses.append(loss.item())

    def _recent_loss(self) -> float:
        return float(np.mean(self.losses[-50:])) if self.losses else math.nan

    def _evaluate(self, step: int, seconds: float) -> None:
        """Measure the val loss; keep the weights when they are the best so far."""
        val = self.val_loss()
        if val < self.best:
            self.best, self.best_step = val, step
            self.save_weights()
        self.log["progress"].append({"step": step, "seconds": round(seconds, 1),
                                     "train_loss": round(self._recent_loss(), 4), "val_loss": round(val, 4)})
        _say(f"eval step {step} train {self._recent_loss():.3f} val {val:.3f} (best {self.best:.3f} at step "
             f"{self.best_step}) {time.monotonic() - self.t0:.0f}s")

    def _summary(self, steps: int, seconds: float) -> dict[str, Any]:
        tokens = steps * self.cfg.batch * self.cfg.seq
        summary = {"steps": steps, "seconds": round(seconds, 1), "tokens": tokens,
                   "tokens_per_s": round(tokens / max(seconds, 1e-9)),
                   "epochs": round(tokens / max(len(self.train_stream), 1), 2),
                   "best_val_loss": round(self.best, 4), "best_step": self.best_step,
                   "first_train_loss": round(self.losses[0], 4) if self.losses else None,
                   "last_train_loss": round(self._recent_loss(), 4) if self.losses else None}
        self.log["training"] = summary
        return summary


def _say(message: str) -> None:
    print(message, flush=True)


def train(out: str | Path, spec: ModelSpec = DEMO_SPEC, cfg: TrainConfig = TrainConfig(),
          evaluate_after: bool = True) -> dict[str, Any]:
    """Train into ``out`` and return the run's summary (also written to ``OUT/eval.json``)."""
    from demo_model import evaluate

    trainer = Trainer(Path(out), spec, cfg)
    trainer.prepare()
    trainer.build()
    trainer.run()
    log = trainer.log
    if evaluate_after:
        try:
            log["evaluation"] = evaluate.evaluate(out, docs=trainer.docs, max_tokens=cfg.eval_max_tokens or None)
            log["passed"] = log["evaluation"]["passed"]
        except Exception as exc:  # the trained weights are in OUT already: keep the run's log with them
            logger.exception("the final evaluation failed")
            log["evaluation_error"], log["passed"] = repr(exc), False
    log["total_seconds"] = round(time.monotonic() - trainer.t0, 1)
    (Path(out) / "eval.json").write_text(json.dumps(log, indent=2) + "\n")
    return log


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    for group in (asdict(TrainConfig()), asdict(DEMO_SPEC)):
        for name, value in group.items():
            flag = f"--{name.replace('_', '-')}"
            if isinstance(value, bool):
                parser.add_argument(flag, action="store_true")
            else:
                parser.add_argument(flag, type=type(value), default=value)
    parser.add_argument("--no-eval", action="store_true", help="skip the final evaluation")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")  # encoding the text uses every core
    spec = replace(DEMO_SPEC, **{k: getattr(args, k) for k in asdict(DEMO_SPEC)})
    cfg = TrainConfig(**{k: getattr(args, k) for k in asdict(TrainConfig())})
    log = train(args.out, spec, cfg, evaluate_after=not args.no_eval)
    summary = {k: log[k] for k in ("parameters", "training", "passed", "total_seconds") if k in log}
    if "evaluation" in log:
        summary["heldout"] = log["evaluation"]["heldout"]
        summary["samples"] = [{k: s[k] for k in ("prompt", "text", "passed")} for s in log["evaluation"]["samples"]]
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    raise SystemExit(main())
