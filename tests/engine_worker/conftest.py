"""The engine's tests import mlx through :mod:`engine_worker.runner.mlx_core` before any test module
imports ``mlx.core`` itself, so the whole session runs on the fast BLAS."""

from __future__ import annotations

import engine_worker.runner.mlx_core  # noqa: F401
