"""How well a model folder writes Python it has never seen: the demo model's goals, measured.

* **Held-out loss**: mean next-token cross-entropy (nats) over the test split of
  :mod:`demo_model.code_data` (modules no training run uses), goal at most 3.0.
* **Greedy continuations** of code prompts, 64 new tokens each (special tokens banned, so every
  sample has 64), each of which must hold at least 3 distinct identifiers (not keywords), give no
  single identifier more than 30% of its tokens, and hold no U+FFFD or control character.

    python -m demo_model.evaluate MODEL_DIR [--json OUT.json] [--max-tokens N]

exits 1 when a goal is missed. The model is loaded by the service's own loader.
"""

from __future__ import annotations

import argparse
import json
import keyword
import logging
import math
import re
import unicodedata
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from demo_model import code_data

logger = logging.getLogger(__name__)

PROMPTS = ("def fibonacci(n):", "class Stack:", "import os\n\ndef ")
SAMPLE_TOKENS = 64
MAX_HELDOUT_LOSS = 3.0
MAX_IDENTIFIER_SHARE = 0.30
MIN_DISTINCT_IDENTIFIERS = 3
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def heldout_loss(model: Any, tokens: np.ndarray, *, seq: int = 512, batch: int = 16) -> float:
    """Mean next-token cross-entropy (nats) of ``model`` over ``tokens``, in non-overlapping
    windows of ``seq`` predictions (a shorter last window included)."""
    from engine_worker.runner.mlx_core import mx

    import mlx.nn as nn

    starts = list(range(0, max(len(tokens) - 1, 0), seq))
    total, count = 0.0, 0
    for i in range(0, len(starts), batch):
        group = [tokens[s: s + seq + 1].astype(np.int32) for s in starts[i: i + batch]]
        for length in sorted({len(g) for g in group}):  # only the last window can be shorter
            rows = np.stack([g for g in group if len(g) == length])
            x, y = mx.array(rows[:, :-1]), mx.array(rows[:, 1:])
            losses = nn.losses.cross_entropy(model(x).astype(mx.float32), y, reduction="sum")
            total += losses.item()
            count += y.size
    return total / count if count else math.nan


def token_spans(tokenizer: Any, ids: list[int]) -> list[tuple[int, int]]:
    """The character span of each token in ``tokenizer.decode(ids)``."""
    spans, end = [], 0
    for i in range(len(ids)):
        new_end = len(tokenizer.decode(ids[: i + 1]))
        spans.append((min(end, new_end), new_end))
        end = new_end
    return spans


def sample_checks(text: str, spans: list[tuple[int, int]]) -> dict[str, Any]:
    """The continuation goals for one sample: its text and the character span of each token."""
    tokens_of: dict[str, set[int]] = defaultdict(set)
    for m in _IDENTIFIER.finditer(text):
        if keyword.iskeyword(m.group()):
            continue
        tokens_of[m.group()].update(i for i, (a, b) in enumerate(spans) if a < m.end() and b > m.start())
    n = max(len(spans), 1)
    top = max(tokens_of, key=lambda k: len(tokens_of[k]), default=None)
    share = len(tokens_of[top]) / n if top else 0.0
    bad = sorted({f"U+{ord(c):04X}" for c in text
                  if c == "\ufffd" or (unicodedata.category(c) == "Cc" and c not in "\n\t")})
    checks = {
        "distinct_identifiers": len(tokens_of),
        "most_repeated_identifier": top,
        "most_repeated_share": round(share, 3),
        "bad_characters": bad,
    }
    checks["passed"] = (len(tokens_of) >= MIN_DISTINCT_IDENTIFIERS and share <= MAX_IDENTIFIER_SHARE
                        and not bad)
    return checks


def greedy_ids(model: Any, tokenizer: Any, prompt: str, n: int = SAMPLE_TOKENS) -> list[int]:
    """``n`` greedy tokens after ``prompt`` (BOS added as the service adds it), never a special
    token, so the sample always has ``n`` tokens."""
    from engine_worker.runner.mlx_core import mx

    from mlx_lm.generate import generate_step

    banned = mx.array(sorted(set(tokenizer.all_special_ids)))

    def ban_special(_tokens: Any, logits: Any) -> Any:
        logits[:, banned] = -math.inf
        return logits

    prompt_ids = mx.array(tokenizer.encode(prompt))
    steps = generate_step(prompt_ids, model, max_tokens=n, sampler=lambda lp: mx.argmax(lp, axis=-1),
                          logits_processors=[ban_special])
    return [int(token) for token, _ in steps]


def continuation_report(model: Any, tokenizer: Any, prompts: tuple[str, ...] = PROMPTS) -> list[dict[str, Any]]:
    report = []
    for prompt in prompts:
        ids = greedy_ids(model, tokenizer, prompt)
        text = tokenizer.decode(ids)
        report.append({"prompt": prompt, "text": text, "tokens": len(ids),
                       **sample_checks(text, token_spans(tokenizer, ids))})
    return report


def heldout_report(model: Any, model_dir: Path, docs: list[code_data.Document], max_tokens: int | None,
                   seq: int = 512) -> dict[str, Any]:
    """Held-out loss over ``docs`` (their test split), overall and per source, with bytes/token."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    bos, eos = tok.token_to_id("<|bos|>"), tok.token_to_id("<|eos|>")
    test = code_data.by_split(docs)["test"]
    out: dict[str, Any] = {"documents": len(test), "by_source": {}}
    weighted, total_tokens = 0.0, 0
    for source in sorted({d.source for d in test}):
        chosen = [d for d in test if d.source == source]
        tokens = code_data.encode_documents(tok, chosen, bos, eos)
        text_tokens = len(tokens) - 2 * len(chosen)  # without each document's bos and eos
        text_bytes = sum(len(d.text.encode()) for d in chosen)
        if max_tokens is not None:
            tokens = tokens[:max_tokens + 1]
        loss = heldout_loss(model, tokens, seq=seq)
        out["by_source"][source] = {"loss": round(loss, 4), "tokens": len(tokens) - 1,
                                    "bytes_per_token": round(text_bytes / max(text_tokens, 1), 3)}
        weighted += loss * (len(tokens) - 1)
        total_tokens += len(tokens) - 1
    out["loss"] = round(weighted / total_tokens, 4) if total_tokens else math.nan
    out["tokens"] = total_tokens
    return out


def evaluate(model_dir: str | Path, *, docs: list[code_data.Document] | None = None,
             max_tokens: int | None = None, model_and_tokenizer: tuple[Any, Any] | None = None) -> dict[str, Any]:
    """The goals' figures for the model in ``model_dir`` on ``docs`` (default: corpus plus this
    Python's standard library), with ``passed`` true when every goal is met. ``max_tokens``
    bounds the held-out tokens per source."""
    from engine_worker.runner.loader import load_model

    model_dir = Path(model_dir)
    model, tokenizer = model_and_tokenizer or load_model(model_dir)
    heldout = heldout_report(model, model_dir, docs if docs is not None else code_data.gather(), max_tokens)
    samples = continuation_report(model, tokenizer)
    return {
        "heldout": heldout,
        "samples": samples,
        "goals": {"max_heldout_loss": MAX_HELDOUT_LOSS, "max_identifier_share": MAX_IDENTIFIER_SHARE,
                  "min_distinct_identifiers": MIN_DISTINCT_IDENTIFIERS, "sample_tokens": SAMPLE_TOKENS},
        "passed": heldout["loss"] <= MAX_HELDOUT_LOSS and all(s["passed"] for s in samples),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--json", help="also write the summary here")
    parser.add_argument("--max-tokens", type=int, default=None, help="held-out tokens per source (default all)")
    parser.add_argument("--site-packages-mb", type=float, default=0.0,
                        help="also hold out site-packages modules (up to this many MB are read)")
    args = parser.parse_args(argv)
    docs = code_data.gather(site_packages_mb=args.site_packages_mb)
    summary = evaluate(args.model_dir, docs=docs, max_tokens=args.max_tokens)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    raise SystemExit(main())
