"""The inference engine: a port of vllm-mlx's Scheduler and EngineCore onto mlx-lm's BatchGenerator.

This package never imports Django, DRF, Channels, Celery or ``api``. Importing it first loads a
fast BLAS (see :mod:`engine_worker.blas`), which must happen before ``mlx.core`` is imported.
"""

from engine_worker import blas as _blas  # noqa: F401  (side effect: OpenBLAS before mlx)
