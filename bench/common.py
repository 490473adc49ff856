"""Helpers shared by the benchmark scripts: model loading, deterministic prompts, statistics.

Importing this module puts the repository on ``sys.path`` and imports mlx through
:mod:`engine_worker.runner.mlx_core`, so OpenBLAS is loaded first (unless ``MLX_DISABLE_OPENBLAS=1``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from engine_worker.runner.mlx_core import mx  # noqa: E402

from engine_worker.runner.blas import blas_status  # noqa: E402

DEFAULT_MODEL = REPO / "var" / "models" / "tiny"


def ensure_default_model(path: str | Path | None) -> Path:
    """Return ``path``; with no path, build (once) and return the tiny test model."""
    if path:
        return Path(path)
    from demo_model.builder import ensure_model

    return ensure_model(DEFAULT_MODEL)


def load_model(path: str | Path):
    """``mlx_lm.load`` the folder; returns ``(model, tokenizer, config)``."""
    from mlx_lm import load

    model, tokenizer, config = load(str(path), return_config=True)
    return model, tokenizer, config


def count_params(model) -> int:
    from mlx.utils import tree_flatten

    return sum(v.size for _, v in tree_flatten(model.parameters()))


def model_dtype(model) -> str:
    from mlx.utils import tree_flatten

    for _, v in tree_flatten(model.parameters()):
        return str(v.dtype).replace("mlx.core.", "")
    return "?"


def prompt_lengths(n: int, lo: int = 16, hi: int = 128) -> list[int]:
    """Deterministic, varied prompt lengths in [lo, hi] (a fixed stride walk, no RNG)."""
    span = hi - lo + 1
    return [lo + (i * 37) % span for i in range(n)]


def make_prompts(tokenizer, n: int, lo: int = 16, hi: int = 128) -> list[list[int]]:
    """``n`` token-id prompts of varied lengths cut from the corpus shipped in the repository.

    Each prompt is BOS (when the tokenizer has one) followed by a slice of the tokenized corpus;
    the same tokenizer always gives the same prompts.
    """
    from demo_model.builder import CORPUS_PATH

    text = CORPUS_PATH.read_text(encoding="utf-8")[:400_000]
    # encode line by line: one long encode() makes transformers warn about model_max_length
    stream = [t for line in text.splitlines(keepends=True) for t in tokenizer.encode(line, add_special_tokens=False)]
    bos = getattr(tokenizer, "bos_token_id", None)
    prompts = []
    for i, length in enumerate(prompt_lengths(n, lo, hi)):
        body = length - (1 if bos is not None else 0)
        start = (i * 1009) % (len(stream) - hi - 1)
        prompts.append(([bos] if bos is not None else []) + stream[start : start + body])
    return prompts


def proc_cpu_ticks(stat_path: str | Path) -> int:
    """User + system CPU ticks from a Linux ``/proc/<pid>/stat`` or ``/proc/<pid>/task/<tid>/stat``."""
    fields = Path(stat_path).read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def median(xs):
    return statistics.median(xs) if xs else None


def percentile(xs, q: float):
    """Nearest-rank-with-interpolation percentile (q in 0..100)."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    f = int(k)
    c = min(f + 1, len(s) - 1)
    return s[f] + (s[c] - s[f]) * (k - f)


def environment() -> dict:
    """Where the numbers come from: machine, device, versions, BLAS."""
    try:
        import mlx_lm

        mlx_lm_version = mlx_lm.__version__
    except Exception:  # pragma: no cover
        mlx_lm_version = "?"
    info = {
        "date_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": platform.node(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm_version,
        "device": str(mx.default_device()),
        "blas": blas_status(),
    }
    try:
        info["device_name"] = mx.device_info().get("device_name")
    except Exception:  # pragma: no cover
        pass
    try:
        import subprocess

        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "engine_worker"],
                               capture_output=True, text=True, timeout=10)
        if head.returncode == 0:
            info["git_head"] = head.stdout.strip()
            info["engine_worker_dirty"] = bool(dirty.stdout.strip())
    except (OSError, subprocess.SubprocessError):  # pragma: no cover
        pass
    try:
        info["load_avg_1m"] = os.getloadavg()[0]
    except OSError:  # pragma: no cover
        pass
    return info


def dump_json_line(obj: dict, out: str | None = None) -> None:
    """Print ``obj`` as the bench's last line, and append it to the JSONL file ``out`` if given."""
    line = json.dumps(obj, sort_keys=False, default=str)
    print(line, flush=True)
    if out:
        with open(out, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")

