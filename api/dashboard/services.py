"""The operator's actions on an engine worker's prefix cache (the admin's engine dashboard)."""

from __future__ import annotations

import json
import logging

import redis

from api.common.errors import ServiceUnavailable, WorkerNotFound
from api.common.redis_client import channel_db, get_redis
from api.common.redis_keys import worker_evict_channel
from api.serving.workers import worker_is_live

logger = logging.getLogger(__name__)


def cache_entry_evict(*, worker_id: str, key: str) -> None:
    """Ask ``worker_id`` to drop the prefix-cache entry ``key`` (a ``key_hash`` of its heartbeat's
    ``cache_entries``), from every tier. The worker reads its command channel within a tick and
    its engine drops the entry between two steps; its next heartbeat no longer lists it (an
    unknown key changes nothing). Raises WorkerNotFound for a worker without a live heartbeat,
    ServiceUnavailable when Redis is unreachable or the worker is not listening right now (it
    resubscribes within a tick)."""
    try:
        if not worker_is_live(worker_id):
            raise WorkerNotFound(worker_id)
        client = get_redis()
        listeners = client.publish(worker_evict_channel(channel_db(client), worker_id), json.dumps({"key": key}))
    except redis.RedisError:
        raise ServiceUnavailable("Cannot reach the engine workers (Redis is unreachable).") from None
    if not listeners:
        raise ServiceUnavailable(f"Engine worker {worker_id} is not listening for commands right now; "
                                 f"retry in a moment.")
    logger.info("asked worker %s to evict prefix-cache entry %s", worker_id, key)
