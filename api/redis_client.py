"""The web process's Redis connection (one pool per process)."""

from __future__ import annotations

from functools import lru_cache

import redis
from django.conf import settings

# Short timeouts: a request must fail fast (and fall back, where it can) when Redis is down,
# rather than hang a web thread.
SOCKET_TIMEOUT_S = 2.0


@lru_cache(maxsize=1)
def get_redis() -> redis.Redis:
    return redis.Redis.from_url(
        settings.REDIS_URL,
        decode_responses=True,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=SOCKET_TIMEOUT_S,
    )
