"""Whether a given engine worker is alive: its heartbeat key (``engine:workers:<id>``, with a TTL)
exists. For a container's health check, which knows its worker by id or by its host's prefix."""

from __future__ import annotations

import re

from api import keys
from api.redis_client import get_redis

_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def worker_ids_alive(*, worker_id: str | None = None, id_prefix: str = "") -> list[str]:
    """The ids of the live workers that are ``worker_id``, or (without it) whose ids start with
    ``id_prefix``. Raises redis.RedisError if Redis is unreachable."""
    client = get_redis()
    if worker_id is not None:
        return [worker_id] if client.exists(keys.worker_heartbeat_key(worker_id)) else []
    pattern = keys.worker_heartbeat_key(_GLOB_SPECIAL.sub(r"\\\1", id_prefix)) + "*"
    prefix = len(keys.WORKER_HEARTBEAT_PREFIX)
    return sorted(name[prefix:] for name in client.scan_iter(match=pattern, count=100))
