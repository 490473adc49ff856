"""Reads of the workers' heartbeat history (``api.worker.history``): the dashboard's chart points."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from api.common.redis_client import get_redis
from api.common.redis_keys import WORKER_HISTORY_S, worker_history_key
from api.worker.history import HistorySample
from engine_worker.protocol import from_dict

logger = logging.getLogger(__name__)


def worker_history(*, worker_ids: list[str], now: float) -> dict[str, list[dict[str, Any]]]:
    """Per worker, its samples of the last ``WORKER_HISTORY_S`` seconds, oldest first, each a
    :class:`HistorySample` with ``tokens_per_second``: the rate of the engine's generated-token
    counter since the sample before (None for a worker's first sample, and where the counter went
    back: the engine restarted). Raises redis.RedisError."""
    if not worker_ids:
        return {}
    pipe = get_redis().pipeline(transaction=False)
    for worker_id in worker_ids:
        pipe.lrange(worker_history_key(worker_id), 0, -1)
    oldest = now - WORKER_HISTORY_S
    history = {}
    for worker_id, raws in zip(worker_ids, pipe.execute(), strict=True):
        history[worker_id] = [p for p in _with_rates(_parse(worker_id, raws)) if p["t"] > oldest]
    return history


def _parse(worker_id: str, raws: list[str]) -> list[HistorySample]:
    samples = []
    for raw in raws:
        try:
            samples.append(from_dict(HistorySample, json.loads(raw)))
        except (TypeError, ValueError):
            logger.warning("ignoring a malformed history sample of worker %s", worker_id)
    return samples


def _with_rates(samples: list[HistorySample]) -> list[dict[str, Any]]:
    points = []
    previous: HistorySample | None = None
    for sample in samples:
        rate = None
        if previous is not None:
            elapsed = sample.t - previous.t
            generated = sample.generated_tokens - previous.generated_tokens
            if elapsed > 0 and generated >= 0:
                rate = round(generated / elapsed, 1)
        points.append({**dataclasses.asdict(sample), "tokens_per_second": rate})
        previous = sample
    return points


def recent_rate(points: list[dict[str, Any]], window_s: float = 10.0) -> float:
    """The engine's generation speed over about the last ``window_s`` seconds of samples (a few
    heartbeats: one period alone is noisy), from its counter; 0 without two samples."""
    if len(points) < 2:
        return 0.0
    end = points[-1]
    start = next((p for p in points if p["t"] >= end["t"] - window_s and p is not end), points[-2])
    elapsed, generated = end["t"] - start["t"], end["generated_tokens"] - start["generated_tokens"]
    return round(generated / elapsed, 1) if elapsed > 0 and generated >= 0 else 0.0
