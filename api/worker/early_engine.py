"""The engine process of ``manage.py run_engine_worker``, spawned before Django loads its apps.

A worker's own start (``django.setup()``, the system checks and the command's imports: Django's
admin, DRF, Celery) and its engine process's start (mlx-lm, transformers, the model) are both
seconds long and need nothing of each other, so manage.py spawns the engine process first
(:func:`spawn_engine`) and the command takes it over (:func:`take_engine`) once Django is set up:
the worker is ready when the slower of the two is, not after both.

Only ``django.conf.settings`` is read here, which needs no app loaded.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from django.conf import settings

from api.worker.config import WorkerConfig
from engine_worker.runtime import ChildSpec, EngineChild

_spawned: tuple[WorkerConfig, EngineChild] | None = None


def worker_config(worker_id: str | None = None) -> WorkerConfig:
    """The worker's settings; ``worker_id`` (the command's ``--worker-id``) replaces the default id."""
    config = WorkerConfig.from_settings()
    return replace(config, worker_id=worker_id) if worker_id else config


def child_spec(config: WorkerConfig) -> ChildSpec:
    """What the engine process is spawned with. Its engine's settings come from the environment it
    inherits (``EngineConfig.from_env``), so the one that settings resolves is exported first."""
    os.environ["ENGINE_POLICY"] = settings.ENGINE_POLICY
    os.environ["ENGINE_PREFILL_BATCH_SIZE"] = str(settings.ENGINE_PREFILL_BATCH_SIZE)
    return ChildSpec(worker_id=config.worker_id, model_path=config.model_path, model_name=config.model_name,
                     stream_interval_s=config.stream_interval_s, heartbeat_s=config.heartbeat_s)


def spawn_engine(argv: list[str]) -> None:
    """Spawn the engine process of the worker that ``argv`` (the command's arguments) starts."""
    global _spawned
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--worker-id", default=None)
    parser.add_argument("-h", "--help", action="store_true")
    parser.add_argument("--settings", default=None)
    parser.add_argument("--pythonpath", default=None)
    known, _ = parser.parse_known_args(argv)
    if known.help or known.settings or known.pythonpath:
        return  # no worker starts, or Django reads settings this process has not loaded yet
    config = worker_config(known.worker_id)
    _spawned = (config, EngineChild(child_spec(config)))


def take_engine(worker_id: str | None) -> tuple[WorkerConfig, EngineChild | None]:
    """The worker's settings and the engine process :func:`spawn_engine` started with them, or
    fresh settings and None when none was spawned (the command then spawns it itself)."""
    global _spawned
    if _spawned is None:
        return worker_config(worker_id), None
    spawned, _spawned = _spawned, None
    return spawned
