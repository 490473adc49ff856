"""One job's failed write never costs the others theirs, and a final reaches the stream and the
group only once its row is stored.

Transactional: after a failed write the sink discards a broken connection (Django closes one that
is inside a test's transaction)."""

from __future__ import annotations

import time

import pytest
from django.db import DataError, OperationalError

from api.common.redis_keys import job_stream_key
from api.jobs.services import lifecycle as job_lifecycle
from api.jobs.services import outputs as job_outputs
from api.models import Job, JobStatus
from api.worker.sink import OUTPUT_NOT_STORED, RedisJobSink
from engine_worker.protocol import FinalResult, OutputChunk, StepBatch
from tests.api.factories import make_job

pytestmark = pytest.mark.django_db(transaction=True)


def _refuse(monkeypatch, name: str, bad: str, error: type[Exception] = DataError) -> list[int]:
    """Make ``job_outputs.<name>`` fail, as the database would, for any call whose batch holds
    job ``bad``; returns the sizes of the batches it was called with."""
    real = getattr(job_outputs, name)
    sizes: list[int] = []

    def write(**kwargs):
        batch = kwargs.get("results", kwargs.get("progress"))
        sizes.append(len(batch))
        if any(item.job_id == bad for item in batch):
            raise error("refused")
        return real(**kwargs)

    monkeypatch.setattr(job_outputs, name, write)
    return sizes


def _jobs(n: int) -> list[str]:
    return [str(make_job(status=JobStatus.IN_PROGRESS, worker_id="w").id) for _ in range(n)]


def _final(job_id: str, text: str = "done", seq: int = 2) -> FinalResult:
    return FinalResult(job_id=job_id, text=text, finish_reason="length", prompt_tokens=3, completion_tokens=seq,
                       finished_at=time.time(), last_seq=seq)


def _chunk(job_id: str, seq: int) -> OutputChunk:
    return OutputChunk(job_id=job_id, seq=seq, text=f"<{seq}>", completion_tokens=seq)


def _final_messages(redis_client, job_id: str) -> list[dict]:
    import json

    return [json.loads(f["data"]) for _, f in redis_client.xrange(job_stream_key(job_id)) if f["type"] == "final"]


def _stream_finals(redis_client, job_id: str) -> list[str]:
    return [final["status"] for final in _final_messages(redis_client, job_id)]


def test_a_failed_batch_of_finals_is_written_job_by_job_and_only_the_refused_job_fails(redis_client, monkeypatch):
    bad, *good = _jobs(3)
    sizes = _refuse(monkeypatch, "jobs_store_finals", bad)
    sink = RedisJobSink(worker_id="w", redis_client=redis_client)
    sink.publish(StepBatch(chunks=tuple(_chunk(j, 1) for j in (bad, *good))))

    sink.publish(StepBatch(chunks=tuple(_chunk(j, 2) for j in (bad, *good)),
                           finals=tuple(_final(j) for j in (bad, *good))))

    assert sizes == [3, 1, 1, 1]  # the batch, then each job alone
    for job_id in good:
        row = Job.objects.get(id=job_id)
        assert (row.status, row.output_text) == (JobStatus.COMPLETED, "done")
        assert _stream_finals(redis_client, job_id) == ["completed"]
    row = Job.objects.get(id=bad)
    assert (row.status, row.finish_reason, row.error) == (
        JobStatus.FAILED, "error", OUTPUT_NOT_STORED.format(error="DataError"))
    # Its clients get that end, never a completed one, after the chunks they already had.
    assert _stream_finals(redis_client, bad) == ["failed"]
    [final] = _final_messages(redis_client, bad)
    assert (final["status"], final["error"], final["seq"]) == ("failed", row.error, 1)
    deltas = [int(f["seq"]) for _, f in redis_client.xrange(job_stream_key(bad)) if f["type"] == "delta"]
    assert deltas == [1]
    assert sink._failed == set()  # its final was the last of it


def test_a_job_whose_progress_write_is_refused_fails_alone_and_its_later_outputs_are_dropped(redis_client, monkeypatch):
    bad, good = _jobs(2)
    sizes = _refuse(monkeypatch, "jobs_record_progress", bad)
    sink = RedisJobSink(worker_id="w", redis_client=redis_client, progress_interval_s=0.0)

    sink.publish(StepBatch(chunks=(_chunk(bad, 1), _chunk(good, 1))))

    assert sorted(sizes) == [1, 1, 2]
    assert Job.objects.get(id=good).output_text == "<1>"
    row = Job.objects.get(id=bad)
    assert row.status == JobStatus.FAILED and row.error == OUTPUT_NOT_STORED.format(error="DataError")
    assert [f["seq"] for f in _final_messages(redis_client, bad)] == [1]
    # The worker's next heartbeat stops it in the engine.
    assert job_lifecycle.jobs_cancel_requested(worker_id="w", job_ids=[bad, good]) == [bad]
    # Until then its chunks and its final (the engine's abort) go nowhere; the other job goes on.
    sink.publish(StepBatch(chunks=(_chunk(bad, 2), _chunk(good, 2))))
    sink.publish(StepBatch(chunks=(_chunk(bad, 3), _chunk(good, 3)), finals=(_final(bad, seq=3), _final(good, seq=3))))
    assert [int(f["seq"]) for _, f in redis_client.xrange(job_stream_key(bad)) if f["type"] == "delta"] == [1]
    assert sink._failed == set()
    assert _stream_finals(redis_client, bad) == ["failed"]
    assert Job.objects.get(id=bad).status == JobStatus.FAILED
    assert Job.objects.get(id=good).status == JobStatus.COMPLETED and _stream_finals(redis_client, good) == ["completed"]


def test_a_lost_database_connection_fails_no_job_and_publishes_no_final(redis_client, monkeypatch):
    jobs = _jobs(2)
    _refuse(monkeypatch, "jobs_store_finals", jobs[0], error=OperationalError)
    sink = RedisJobSink(worker_id="w", redis_client=redis_client)

    sink.publish(StepBatch(finals=tuple(_final(j) for j in jobs)))

    # The first job's own write hit the lost connection too: the jobs are left to their leases
    # (they run again), and nothing announced an end the database does not have.
    assert {Job.objects.get(id=j).status for j in jobs} == {JobStatus.IN_PROGRESS}
    assert all(_stream_finals(redis_client, j) == [] for j in jobs)


def test_the_final_of_a_job_handed_on_to_another_worker_is_not_published(redis_client):
    handed_on, mine = _jobs(2)
    Job.objects.filter(id=handed_on).update(worker_id="w-other")
    sink = RedisJobSink(worker_id="w", redis_client=redis_client)

    sink.publish(StepBatch(finals=(_final(handed_on), _final(mine))))

    assert _stream_finals(redis_client, handed_on) == []
    assert _stream_finals(redis_client, mine) == ["completed"]
    assert Job.objects.get(id=handed_on).status == JobStatus.IN_PROGRESS
