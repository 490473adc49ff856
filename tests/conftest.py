"""Shared fixtures: the real tiny model, built once per machine under var/models/tiny."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL_DIR = ROOT / "var" / "models" / "tiny"

pytest_plugins = ["tests.cpu_durations"]


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    """Path of the local test model (built on first use; MODEL_PATH is ignored in tests on purpose,
    so token-level expectations always refer to the same model)."""
    from demo_model.builder import ensure_model

    # One build per machine: xdist's workers (and other runs) wait on the lock for the first.
    TINY_MODEL_DIR.parent.mkdir(parents=True, exist_ok=True)
    with open(TINY_MODEL_DIR.parent / ".tiny.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return ensure_model(TINY_MODEL_DIR)


@pytest.fixture(scope="session")
def tiny_model(tiny_model_path):
    """``(model, tokenizer)`` loaded once through ``mlx_lm.load``."""
    import engine_worker.runner.mlx_core  # noqa: F401  (OpenBLAS before mlx-lm loads mlx)

    from mlx_lm import load

    return load(str(tiny_model_path))


def pytest_configure(config):
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
