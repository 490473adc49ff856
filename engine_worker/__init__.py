"""The inference engine: a port of vllm-mlx's Scheduler and EngineCore onto mlx-lm's BatchGenerator.

Where each concept lives:

* ``sched/``: the scheduler, a state machine with no I/O (waiting queue, admission checks, pacing,
  the batch, preemption, the memory budget, stats);
* ``runner/``: the model runner over mlx-lm's generator, and the only modules that import mlx
  (sampling, log probabilities, detokenizing, loading, device memory, the BLAS preload);
* ``cache/``: the prefix cache, its protocol and the scheduler's seam and hooks into it;
* ``engine/``: ``EngineCore``, the engine thread that owns mlx, with its asyncio API;
* ``runtime/``: the worker's engine process, its I/O thread and output sink;
* ``common/``: what all of them share: request types, configuration, errors;
* ``protocol.py``: the typed messages between the web side, the worker and the engine.

``scheduler.py``, ``engine_core.py`` and ``request.py`` are the seed's import paths
(``vllm_mlx.scheduler`` ...), re-exporting from the folders above.

This package never imports Django, DRF, Channels, Celery or ``api``. Importing it, or its protocol
and runtime modules (what the web side uses), loads neither mlx nor a BLAS: the engine's modules
import mlx through :mod:`engine_worker.runner.mlx_core`, which loads OpenBLAS first.
"""
