from __future__ import annotations

from api.common import redis_keys


def test_redis_names_shared_with_the_worker_are_stable():
    job_id = "8b4f0f3e-0000-4000-8000-000000000000"
    assert redis_keys.job_stream_key(job_id) == f"job:{job_id}:chunks"
    assert redis_keys.worker_heartbeat_key("w-1") == "engine:workers:w-1"
    assert redis_keys.cancel_channel(3) == "engine:cancel:3"
    assert redis_keys.worker_evict_channel(3, "w-1") == "engine:evict:3:w-1"
    assert (redis_keys.JOB_STREAM_FIELD_SEQ, redis_keys.JOB_STREAM_FIELD_TEXT) == ("seq", "text")
