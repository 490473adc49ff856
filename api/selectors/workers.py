"""Reads of the engine workers' heartbeats (Redis keys ``engine:workers:<id>`` with a TTL)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import redis

from api import keys
from api.redis_client import get_redis
from engine_worker.protocol import MemoryStats, WorkerHeartbeat, from_dict

logger = logging.getLogger(__name__)


def _parse_heartbeat(raw: str) -> WorkerHeartbeat | None:
    try:
        data = json.loads(raw)
        memory = from_dict(MemoryStats, data.get("memory") or {})
        heartbeat = from_dict(WorkerHeartbeat, {**data, "memory": memory})
    except (TypeError, ValueError, AttributeError):
        return None
    # from_dict turns JSON lists into tuples; the request rows stay dicts.
    return heartbeat


def worker_list() -> list[WorkerHeartbeat]:
    """The live workers (those whose heartbeat has not expired), sorted by id. Raises
    redis.RedisError if Redis is unreachable (callers decide how to degrade)."""
    client = get_redis()
    names = sorted(client.scan_iter(match=f"{keys.WORKER_HEARTBEAT_PREFIX}*", count=100))
    if not names:
        return []
    workers = []
    for name, raw in zip(names, client.mget(names), strict=True):
        heartbeat = _parse_heartbeat(raw) if raw else None
        if heartbeat is None:
            if raw:
                logger.warning("Ignoring a malformed heartbeat under %s", name)
            continue
        workers.append(heartbeat)
    return workers


def worker_is_live(worker_id: str) -> bool:
    """Whether ``worker_id``'s heartbeat is there. Raises redis.RedisError."""
    return bool(get_redis().exists(keys.worker_heartbeat_key(worker_id)))


def worker_live_count() -> int:
    try:
        return len(worker_list())
    except redis.RedisError:
        return 0


def model_list() -> list[dict[str, Any]]:
    """The models served right now, each with the workers serving it (OpenAI-style list items)."""
    by_model: dict[str, dict[str, Any]] = {}
    now = time.time()
    for worker in worker_list():
        entry = by_model.setdefault(
            worker.model,
            {"id": worker.model, "object": "model", "context_length": worker.context_length, "workers": []},
        )
        entry["workers"].append(
            {
                "worker_id": worker.worker_id,
                "device": worker.device,
                "num_running": worker.num_running,
                "num_waiting": worker.num_waiting,
                "last_seen_s": round(max(0.0, now - worker.sent_at), 3),
            }
        )
    return sorted(by_model.values(), key=lambda m: m["id"])
