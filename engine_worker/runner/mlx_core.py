"""``mlx.core`` with a fast BLAS under it: the engine imports mlx through this module.

On Linux the ``mlx-cpu`` wheel's matrix products go through whichever ``cblas_sgemm`` the dynamic
linker resolved when ``mlx.core`` was first loaded, so OpenBLAS must be loaded before that, once
per process (:mod:`engine_worker.runner.blas`). Every engine module that uses mlx or mlx-lm (which
imports ``mlx.core`` itself) imports this module first: ``from engine_worker.runner.mlx_core import mx``
(ruff's isort puts it ahead of the third-party imports, see pyproject.toml), so whichever engine
module a process imports first, the preload comes before mlx. Processes that never import an
engine module, the web side's, load neither.
"""

from __future__ import annotations

from engine_worker.runner.blas import preload_openblas

preload_openblas()

import mlx.core as mx  # noqa: E402  (after the preload, which is the point of this module)

__all__ = ["mx"]
