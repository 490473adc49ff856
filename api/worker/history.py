"""Each worker's recent heartbeats, kept in Redis for the dashboard's charts.

At every beat the worker appends one :class:`HistorySample` (JSON) to its list
``engine:history:<worker_id>``, trims the list to the last ``WORKER_HISTORY_S`` seconds' worth of
beats and lets it expire that long after the last one. The dashboard
(``api.serving.worker_history.worker_history``) reads the lists, so its charts show the last ten minutes as soon as it opens,
whether or not anyone was watching before.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

import redis

from api.common.redis_keys import WORKER_HISTORY_S, worker_history_key
from engine_worker.protocol import WorkerHeartbeat

# A list of at most this many samples, whatever the heartbeat period: with beats faster than one
# every half second the charts cover less than WORKER_HISTORY_S, and a page load stays small.
MAX_SAMPLES = 1200


@dataclass(frozen=True)
class HistorySample:
    t: float  # the heartbeat's sent_at (unix time)
    generated_tokens: int  # the engine's counter: the charts draw its rate
    active_bytes: int
    peak_bytes: int
    cache_bytes: int
    limit_bytes: int
    running: int
    waiting: int  # requests waiting in this worker's engine
    queued: int | None  # jobs queued service-wide, not yet claimed; None when the database was unreachable


def history_sample(beat: WorkerHeartbeat, *, queued: int | None) -> HistorySample:
    memory = beat.memory
    return HistorySample(t=beat.sent_at, generated_tokens=beat.generated_tokens, active_bytes=memory.active_bytes,
                         peak_bytes=memory.peak_bytes, cache_bytes=memory.cache_bytes,
                         limit_bytes=memory.limit_bytes, running=beat.num_running, waiting=beat.num_waiting,
                         queued=queued)


def max_samples(heartbeat_s: float) -> int:
    return min(MAX_SAMPLES, math.ceil(WORKER_HISTORY_S / heartbeat_s) + 1)


def history_record(client: redis.Redis, *, worker_id: str, sample: HistorySample, heartbeat_s: float) -> None:
    """Append ``sample`` to the worker's list (one round trip). Raises redis.RedisError."""
    key = worker_history_key(worker_id)
    pipe = client.pipeline(transaction=False)
    pipe.rpush(key, json.dumps(dataclasses.asdict(sample)))
    pipe.ltrim(key, -max_samples(heartbeat_s), -1)
    pipe.expire(key, WORKER_HISTORY_S)
    pipe.execute()
