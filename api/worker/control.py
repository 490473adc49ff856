"""An engine worker's periodic duties, run on its I/O thread between output batches.

* Every ``heartbeat_s``: publish the worker's heartbeat to Redis (with a TTL, so a dead worker
  disappears by itself), renew the leases of the jobs it holds (one UPDATE), cancel held jobs
  whose cancellation is in the database (in case the pub/sub message below was lost), and append
  a sample of the beat to the worker's history (api/worker/history.py, the dashboard's charts). A
  worker whose engine thread has died is stopped through its SIGTERM path, so its jobs go back to
  the queue.
* Every tick: read the ``engine:cancel`` pub/sub channel and this worker's own
  ``engine:evict:<worker_id>`` channel without waiting, so a cancel or an operator's eviction of a
  prefix-cache entry reaches the engine within a tick.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from typing import Any

import redis
from django.db import DatabaseError, close_old_connections

from api.common.redis_client import channel_db
from api.common.redis_keys import (
    WORKER_HEARTBEAT_TTL_S,
    cancel_channel,
    worker_evict_channel,
    worker_heartbeat_key,
)
from api.jobs.selectors import job_queued_count
from api.jobs.services import lifecycle as job_lifecycle
from api.worker.history import history_record, history_sample
from engine_worker.protocol import to_dict
from engine_worker.runtime import Host

logger = logging.getLogger(__name__)


class WorkerControl:
    def __init__(self, *, worker_id: str, host: Host, redis_client: redis.Redis, heartbeat_s: float,
                 lease_s: float) -> None:
        self.worker_id = worker_id
        self._host = host
        self._redis = redis_client
        self._heartbeat_s = heartbeat_s
        self._lease_s = lease_s
        self._next_beat = 0.0
        self._pubsub: Any = None
        self._cancel_channel = cancel_channel(channel_db(redis_client))
        self._evict_channel = worker_evict_channel(channel_db(redis_client), worker_id)
        self.stopping = False

    def tick(self) -> None:
        """One round of duties; never raises for Redis or database trouble (logged, retried)."""
        self._read_commands()
        if time.monotonic() >= self._next_beat:
            self._next_beat = time.monotonic() + self._heartbeat_s
            self.beat()

    def beat(self) -> None:
        if not self._host.engine_running() and not self.stopping:
            self._engine_died()
            return
        held = self._host.held_jobs()
        beat = self._host.heartbeat(self.worker_id)
        try:
            self._redis.set(worker_heartbeat_key(self.worker_id), json.dumps(to_dict(beat)),
                            ex=WORKER_HEARTBEAT_TTL_S)
        except redis.RedisError:
            logger.warning("heartbeat publish failed", exc_info=True)
        queued = None
        try:
            job_lifecycle.job_renew_leases(worker_id=self.worker_id, job_ids=held, lease_s=self._lease_s)
            for job_id in job_lifecycle.jobs_cancel_requested(worker_id=self.worker_id, job_ids=held):
                self._host.cancel(job_id)
            queued = job_queued_count()
        except DatabaseError:
            logger.warning("lease renewal failed", exc_info=True)
            close_old_connections()
        try:
            history_record(self._redis, worker_id=self.worker_id, sample=history_sample(beat, queued=queued),
                           heartbeat_s=self._heartbeat_s)
        except redis.RedisError:
            logger.warning("could not record the heartbeat's history sample", exc_info=True)

    def close(self) -> None:
        """Unsubscribe and remove the heartbeat (an orderly stop)."""
        if self._pubsub is not None:
            self._pubsub.close()
            self._pubsub = None
        try:
            self._redis.delete(worker_heartbeat_key(self.worker_id))
        except redis.RedisError:
            logger.warning("could not delete the heartbeat key", exc_info=True)

    def _read_commands(self) -> None:
        try:
            if self._pubsub is None:
                self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
                self._pubsub.subscribe(self._cancel_channel, self._evict_channel)
            while (message := self._pubsub.get_message(timeout=0)) is not None:
                if message.get("channel") == self._evict_channel:
                    self._on_evict_message(message.get("data"))
                else:
                    self._on_cancel_message(message.get("data"))
        except (redis.RedisError, OSError):
            logger.warning("command subscription lost; subscribing again at the next tick", exc_info=True)
            self._pubsub = None

    def _on_cancel_message(self, data: Any) -> None:  # whatever was published: checked here
        try:
            job_id = str(json.loads(data)["job_id"])
        except (TypeError, ValueError, KeyError):
            logger.warning("ignoring malformed cancel message %r", data)
            return
        if self._host.cancel(job_id):
            logger.info("cancelled job %s", job_id)

    def _on_evict_message(self, data: Any) -> None:
        try:
            key = json.loads(data)["key"]
        except (TypeError, ValueError, KeyError):
            key = None
        if not isinstance(key, str) or not key:
            logger.warning("ignoring malformed evict message %r", data)
            return
        logger.info("evicting prefix-cache entry %s (operator's request)", key)
        self._host.evict_cache_entry(key)

    def _engine_died(self) -> None:
        """The engine thread is gone (a fatal error, not one request's failure): stop this worker
        through its SIGTERM path, so it exits, its supervisor restarts it, and the jobs it still
        holds go back to the queue."""
        logger.critical("engine thread is not running; shutting worker %s down", self.worker_id)
        self.stopping = True
        os.kill(os.getpid(), signal.SIGTERM)
