"""Reads of the engine workers' heartbeats (Redis keys ``engine:workers:<id>`` with a TTL)."""

from __future__ import annotations

import json
import logging
import re
import threading
import time

import redis

from api.common import redis_keys
from api.common.redis_client import get_redis
from engine_worker.protocol import MemoryStats, WorkerHeartbeat, from_dict

logger = logging.getLogger(__name__)


def _parse_heartbeat(raw: str | bytes) -> WorkerHeartbeat | None:
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
    names = sorted(client.scan_iter(match=f"{redis_keys.WORKER_HEARTBEAT_PREFIX}*", count=100))
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
    return bool(get_redis().exists(redis_keys.worker_heartbeat_key(worker_id)))


_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def worker_ids_alive(*, worker_id: str | None = None, id_prefix: str = "") -> list[str]:
    """The ids of the live workers that are ``worker_id``, or (without it) whose ids start with
    ``id_prefix`` (a container's health check knows its worker by id or by its host's prefix).
    Raises redis.RedisError if Redis is unreachable."""
    if worker_id is not None:
        return [worker_id] if worker_is_live(worker_id) else []
    pattern = redis_keys.worker_heartbeat_key(_GLOB_SPECIAL.sub(r"\\\1", id_prefix)) + "*"
    prefix = len(redis_keys.WORKER_HEARTBEAT_PREFIX)
    return sorted(name[prefix:] for name in get_redis().scan_iter(match=pattern, count=100))


def worker_load(worker: WorkerHeartbeat) -> int:
    """A worker's load as its heartbeat last told it: the jobs its engine runs or holds waiting."""
    return worker.num_running + worker.num_waiting


# Heartbeats come every WORKER_HEARTBEAT_S (2 s); reading them (a SCAN of Redis's keys) on every
# submission would cost more than the answer is worth.
LIVE_WORKERS_TTL_S = 1.0
_live_lock = threading.Lock()
_live_cache: tuple[float, dict[str, dict[str, int]]] = (0.0, {})


def worker_capacities(model: str) -> dict[str, int]:
    """``model``'s live workers (their heartbeat has not expired), each with the requests its
    batch runs at once (0: its heartbeat does not say), as the heartbeats said at most
    LIVE_WORKERS_TTL_S ago (read once per process and interval). A busy worker may beat late (a
    long prefill holds its stats), so a late beat is not taken for a death. Raises
    redis.RedisError if Redis is unreachable."""
    global _live_cache
    now = time.monotonic()
    with _live_lock:
        expires, by_model = _live_cache
    if expires <= now:
        by_model = {}
        for worker in worker_list():
            by_model.setdefault(worker.model, {})[worker.worker_id] = worker.capacity
        with _live_lock:
            _live_cache = (now + LIVE_WORKERS_TTL_S, by_model)
    return dict(by_model.get(model, {}))


def worker_ids_serving(model: str) -> frozenset[str]:
    """The ids of ``model``'s live workers (see :func:`worker_capacities`). Raises
    redis.RedisError if Redis is unreachable."""
    return frozenset(worker_capacities(model))


def worker_ids_forget() -> None:
    """Read the heartbeats afresh at the next call of worker_ids_serving (tests)."""
    global _live_cache
    with _live_lock:
        _live_cache = (0.0, {})


def model_served(model: str) -> bool | None:
    """Whether a live worker serves ``model``; None when the heartbeats cannot be read."""
    try:
        return bool(worker_ids_serving(model))
    except redis.RedisError:
        return None
