"""The worker's sink refreshes a job stream's TTL at its first write, at its final and once half
of it has passed, not at every step: one command per job and step instead of two."""

from __future__ import annotations

import pytest

from api.common.redis_keys import job_stream_key
from api.models import JobStatus
from api.worker import sink as sink_module
from api.worker.sink import RedisJobSink
from engine_worker.protocol import FinalResult, OutputChunk, StepBatch
from tests.api.factories import make_job
from tests.api.worker.clock import Clock

pytestmark = pytest.mark.django_db


def _chunk(job_id: str, seq: int) -> OutputChunk:
    return OutputChunk(job_id=job_id, seq=seq, text=f"<{seq}>", completion_tokens=seq)


def test_a_stream_s_ttl_is_refreshed_at_its_first_write_after_half_of_it_and_at_its_final(redis_client, settings,
                                                                                        monkeypatch):
    settings.JOB_STREAM_TTL_S = 100
    clock = Clock()
    monkeypatch.setattr(sink_module.time, "monotonic", clock)
    job_id = str(make_job(status=JobStatus.IN_PROGRESS, worker_id="w").id)
    key = job_stream_key(job_id)
    sink = RedisJobSink(worker_id="w", redis_client=redis_client)

    sink.publish(StepBatch(chunks=(_chunk(job_id, 1),)))
    assert 90 < redis_client.ttl(key) <= 100  # its first write

    redis_client.expire(key, 10)
    clock.now += 49  # less than half of the TTL since the refresh: the next steps refresh nothing
    for seq in (2, 3):
        sink.publish(StepBatch(chunks=(_chunk(job_id, seq),)))
    assert redis_client.ttl(key) <= 10

    clock.now += 2  # half of it passed
    sink.publish(StepBatch(chunks=(_chunk(job_id, 4),)))
    assert 90 < redis_client.ttl(key) <= 100

    redis_client.expire(key, 10)
    clock.now += 1
    sink.publish(StepBatch(finals=(FinalResult(job_id=job_id, text="<1><2><3><4>", last_seq=4,
                                               finish_reason="length", prompt_tokens=3, completion_tokens=4),)))
    assert 90 < redis_client.ttl(key) <= 100  # the final: the stream lives the TTL after it
    assert [fields["type"] for _id, fields in redis_client.xrange(key)][-1] == "final"
    assert job_id not in sink._ttl_at  # nothing kept for an ended job
