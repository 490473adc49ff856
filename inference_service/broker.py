"""Celery's Redis transport (kombu's), less a new Redis client object for every command.

kombu's Redis channel sends the commands outside its consumer loop through
``Channel.conn_or_acquire``, which builds a new ``redis.Redis`` each time: two for every
published message (the exchange's routing table, then the LPUSH) and two for every consumed one
(recording it as unacknowledged, then the ack). Every one of them wraps the channel's same
connection pool, so nothing is gained by a new one, but redis-py 8 builds its response-callback
table in each: about 0.3 ms of Python on the 2-core VM (``bench/broker_bench.py``). That is paid on
a web request's thread for each submission, and in the engine worker by its Celery consumer,
which shares its GIL with the engine thread while a burst of jobs is admitted.

This transport keeps one client per channel and connection pool and is otherwise kombu's own.
``BROKER_SHARED_CLIENT=1`` selects it for ``redis://`` and ``rediss://`` brokers. It is off by
default: on the VM the end-to-end benchmark showed no gain beyond its noise (docs/benchmarks.md),
and it has not run on a GPU host yet.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    _shared_client: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        shared = self._shared_client
        if shared is None or shared.connection_pool is not self.pool:  # the pools are rebuilt on disconnect
            shared = self._shared_client = self._create_client()
        yield shared


class Transport(kombu_redis.Transport):
    Channel = Channel
