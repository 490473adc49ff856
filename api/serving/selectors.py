"""Reads of the models: the configured ones (api/serving/catalog.py) with the live workers serving
each (from their heartbeats), for ``/api/v1/models``, ``/v1/models`` and ``/api/v1/health``."""

from __future__ import annotations

import time
from typing import Any

from api.common.errors import ServiceUnavailable
from api.serving.catalog import configured_models
from api.serving.tokenization import get_tokenizer
from api.serving.workers import worker_list, worker_load
from engine_worker.protocol import WorkerHeartbeat


def model_list() -> list[dict[str, Any]]:
    """Every configured model, ``available`` when a live worker serves it, with those workers
    (device and load); then any model a live worker serves that is not configured here (jobs
    cannot name it: ``configured`` is false). Raises redis.RedisError if Redis is unreachable."""
    by_model: dict[str, list[WorkerHeartbeat]] = {}
    for worker in worker_list():
        by_model.setdefault(worker.model, []).append(worker)
    now = time.time()
    listed = []
    for model in configured_models():
        workers = by_model.pop(model.name, [])
        listed.append(_entry(model.name, workers, now, configured=True, context_length=_context_length(model.path)))
    for name, workers in sorted(by_model.items()):
        listed.append(_entry(name, workers, now, configured=False, context_length=workers[0].context_length))
    return listed


def model_live_workers() -> dict[str, int]:
    """Live workers per configured model (0 for a model no worker serves). Raises
    redis.RedisError if Redis is unreachable."""
    counts = {model.name: 0 for model in configured_models()}
    for worker in worker_list():
        if worker.model in counts:
            counts[worker.model] += 1
    return counts


def _entry(name: str, workers: list[WorkerHeartbeat], now: float, *, configured: bool,
           context_length: int | None) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "context_length": context_length,
        "configured": configured,
        "available": bool(workers),
        "workers": [
            {
                "worker_id": worker.worker_id,
                "device": worker.device,
                "num_running": worker.num_running,
                "num_waiting": worker.num_waiting,
                "load": worker_load(worker),
                "last_seen_s": round(max(0.0, now - worker.sent_at), 3),
            }
            for worker in workers
        ],
    }


def _context_length(path: str) -> int | None:
    try:
        return get_tokenizer(path).info.context_length
    except ServiceUnavailable:  # the folder cannot be read here: get_tokenizer logged why
        return None
