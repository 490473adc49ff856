"""The workers' heartbeat history in Redis: recorded at each beat, capped and expiring, read back as
the dashboard's chart points with the engine's generation rate."""

from __future__ import annotations

import json
import time

import pytest

from api.common.redis_client import channel_db
from api.common.redis_keys import WORKER_HISTORY_S, cancel_channel, worker_evict_channel, worker_history_key
from api.serving.worker_history import recent_rate, worker_history
from api.worker.control import WorkerControl
from api.worker.history import HistorySample, history_record
from tests.api.factories import heartbeat, make_job

pytestmark = pytest.mark.django_db


def sample(t: float, generated: int, **overrides) -> HistorySample:
    fields = {"t": t, "generated_tokens": generated, "active_bytes": 10 << 20, "peak_bytes": 20 << 20,
              "cache_bytes": 1 << 20, "limit_bytes": 1 << 30, "running": 2, "waiting": 1, "queued": 5, **overrides}
    return HistorySample(**fields)


def test_the_history_keeps_ten_minutes_of_beats_and_expires_with_the_worker(redis_client):
    for i in range(12):
        history_record(redis_client, worker_id="w-1", sample=sample(1000.0 + i, i), heartbeat_s=100.0)

    kept = [json.loads(raw)["t"] for raw in redis_client.lrange(worker_history_key("w-1"), 0, -1)]
    assert kept == [1005.0 + i for i in range(7)]  # 600 s of 100 s beats, and the one that starts them
    assert 0 < redis_client.ttl(worker_history_key("w-1")) <= WORKER_HISTORY_S


def test_chart_points_carry_the_rate_of_the_generated_token_counter(redis_client):
    now = time.time()
    beats = [sample(now - 700, 0), sample(now - 6, 100), sample(now - 4, 300), sample(now - 2, 700),
             sample(now - 1, 5)]  # the last: the engine restarted, its counter began again
    for beat in beats:
        history_record(redis_client, worker_id="w-1", sample=beat, heartbeat_s=2.0)

    points = worker_history(worker_ids=["w-1", "w-none"], now=now)

    assert [p["t"] for p in points["w-1"]] == [b.t for b in beats[1:]]  # older than 10 minutes: dropped
    assert [p["tokens_per_second"] for p in points["w-1"]] == [0.1, 100.0, 200.0, None]
    assert points["w-1"][0]["queued"] == 5 and points["w-1"][0]["limit_bytes"] == 1 << 30
    assert points["w-none"] == []


def test_the_current_speed_is_the_counters_rate_over_the_last_ten_seconds_not_one_beat():
    points = [{"t": 100.0 + 2 * i, "generated_tokens": tokens}
              for i, tokens in enumerate((0, 1000, 1100, 2900, 3000, 4000, 4200))]

    assert recent_rate(points) == 320.0  # (4200 - 1000) tokens in the 10 s from t=102 to t=112
    assert recent_rate(points[:2]) == 500.0
    assert recent_rate(points[:1]) == 0.0


class FakeHost:
    def __init__(self) -> None:
        self.evicted: list[str] = []
        self.cancelled: list[str] = []

    def engine_running(self) -> bool:
        return True

    def held_jobs(self) -> list[str]:
        return []

    def heartbeat(self, worker_id: str):
        return heartbeat(worker_id=worker_id, generated_tokens=420)

    def evict_cache_entry(self, key: str) -> bool:
        self.evicted.append(key)
        return True

    def cancel(self, job_id: str) -> bool:
        self.cancelled.append(job_id)
        return True


def control(redis_client, host: FakeHost, worker_id: str = "w-1") -> WorkerControl:
    return WorkerControl(worker_id=worker_id, host=host, redis_client=redis_client, heartbeat_s=2.0, lease_s=30.0)


def test_each_beat_appends_a_sample_with_the_service_wide_queue(redis_client):
    make_job(), make_job()
    worker = control(redis_client, FakeHost())

    worker.beat()
    worker.beat()

    samples = [json.loads(raw) for raw in redis_client.lrange(worker_history_key("w-1"), 0, -1)]
    assert len(samples) == 2
    assert samples[0]["generated_tokens"] == 420 and samples[0]["queued"] == 2
    assert samples[0]["active_bytes"] == 10 << 20 and samples[0]["waiting"] == 0


def test_the_worker_obeys_evicts_on_its_own_channel_only_and_ignores_malformed_ones(redis_client):
    host = FakeHost()
    worker = control(redis_client, host)
    worker.tick()  # subscribes
    db = channel_db(redis_client)
    # Another database's channels, on the same server, are another service's.
    redis_client.publish(worker_evict_channel(db + 1, "w-1"), json.dumps({"key": "other"}))
    redis_client.publish(cancel_channel(db + 1), json.dumps({"job_id": "job-other"}))
    for channel, data in ((worker_evict_channel(db, "w-1"), {"key": "abc123"}), (worker_evict_channel(db, "w-2"), {"key": "f00"}),
                          (worker_evict_channel(db, "w-1"), {"key": 7}), (worker_evict_channel(db, "w-1"), "not json")):
        redis_client.publish(channel, json.dumps(data) if isinstance(data, dict) else data)
    redis_client.publish(cancel_channel(db), json.dumps({"job_id": "job-9"}))

    deadline = time.monotonic() + 5
    while (not host.evicted or not host.cancelled) and time.monotonic() < deadline:
        worker.tick()
        time.sleep(0.05)

    assert host.evicted == ["abc123"]
    assert host.cancelled == ["job-9"]  # the cancel channel is still heard
    worker.close()
