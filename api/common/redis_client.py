"""The web process's Redis connections: one pool per process for sync code, one per event loop
for the WebSocket consumers."""

from __future__ import annotations

import asyncio
import weakref
from functools import lru_cache

import redis
import redis.asyncio as aioredis
from django.conf import settings

# Short timeouts: a request must fail fast (and fall back, where it can) when Redis is down,
# rather than hang a web thread.
SOCKET_TIMEOUT_S = 2.0

_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, aioredis.Redis]] = (
    weakref.WeakKeyDictionary()
)


# The sync client's connections per process. Threads beyond it wait for a free connection (up to
# SOCKET_TIMEOUT_S) instead of failing at once: under a burst of 300 WebSocket submissions each on a
# thread of its own, redis-py's plain pool refused 25-38 of them ("Too many connections"), and their
# rate limit went unenforced.
SYNC_CONNECTIONS = 100


@lru_cache(maxsize=1)
def get_redis() -> redis.Redis:
    pool = redis.BlockingConnectionPool.from_url(
        settings.REDIS_URL,
        decode_responses=True,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=SOCKET_TIMEOUT_S,
        max_connections=SYNC_CONNECTIONS,
        timeout=SOCKET_TIMEOUT_S,
    )
    return redis.Redis(connection_pool=pool)


def channel_db(client: redis.Redis) -> int:
    """The database ``client`` selected: the scope of the pub/sub channels it uses (redis_keys)."""
    return int(client.connection_pool.connection_kwargs.get("db") or 0)


# The process's followed streams are read by one XREAD BLOCK (api/streaming/hub.py), but every new
# follower takes a connection for its first look at its stream, and a burst of them takes many at
# once: redis-py's default of 100 per pool would refuse the 101st with MaxConnectionsError. Redis
# itself accepts 10,000 clients by default; a process's file descriptors bound it long before this.
FOLLOWER_CONNECTIONS = 10_000


def get_async_redis() -> aioredis.Redis:
    """The asyncio client of the running event loop (daphne runs one per process), shared by
    every consumer on it. A client per WebSocket would cost a pool, a TCP connect and the
    protocol handshake per connection, a large share of daphne's time in a burst. Do not close it."""
    per_url = _async_clients.setdefault(asyncio.get_running_loop(), {})
    client = per_url.get(settings.REDIS_URL)
    if client is None:
        client = per_url[settings.REDIS_URL] = aioredis.Redis.from_url(
            settings.REDIS_URL, decode_responses=True, max_connections=FOLLOWER_CONNECTIONS)
    return client
