"""The inference engine: a port of vllm-mlx's Scheduler and EngineCore onto mlx-lm's BatchGenerator.

This package never imports Django, DRF, Channels, Celery or ``api``. Importing it, or its
protocol and runtime modules (what the web side uses), loads neither mlx nor a BLAS: the engine's
modules import mlx through :mod:`engine_worker.runner.mlx_core`, which loads OpenBLAS first.
"""
