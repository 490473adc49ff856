"""The worker's sink writes running jobs' text for polling clients: all of them in one UPDATE per
interval, whatever step each job started at."""

from __future__ import annotations

from unittest import mock

import pytest

from api.jobs.services import outputs as job_outputs
from api.models import Job, JobStatus
from api.worker import sink as sink_module
from api.worker.sink import RedisJobSink
from engine_worker.protocol import OutputChunk, StepBatch
from tests.api.factories import make_job
from tests.api.worker.clock import Clock

pytestmark = pytest.mark.django_db


def test_jobs_that_start_on_different_steps_share_one_progress_write(redis_client, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(sink_module.time, "monotonic", clock)
    jobs = [str(make_job(status=JobStatus.IN_PROGRESS, worker_id="w").id) for _ in range(3)]
    sink = RedisJobSink(worker_id="w", redis_client=redis_client, progress_interval_s=1.0)
    writes = mock.Mock(wraps=job_outputs.jobs_record_progress)
    monkeypatch.setattr(job_outputs, "jobs_record_progress", writes)

    seq = {job_id: 0 for job_id in jobs}
    for step in range(32):  # 32 steps of 0.125 s; job i starts at step 3 * i
        clock.now += 0.125
        running = [job_id for i, job_id in enumerate(jobs) if step >= 3 * i]
        for job_id in running:
            seq[job_id] += 1
        sink.publish(StepBatch(chunks=tuple(
            OutputChunk(job_id=job_id, seq=seq[job_id], text=f"<{seq[job_id]}>", completion_tokens=seq[job_id])
            for job_id in running)))

    # 4 s of steps: one write per second for all running jobs. A timer per job wrote on 12 steps.
    assert writes.call_count == 4
    last = {p.job_id: p for p in writes.call_args.kwargs["progress"]}
    assert set(last) == set(jobs)
    for job_id in jobs:
        row = Job.objects.get(id=job_id)
        assert row.last_seq == last[job_id].last_seq and row.completion_tokens == row.last_seq
        assert row.output_text == "".join(f"<{n}>" for n in range(1, row.last_seq + 1))


def test_first_token_times_wait_for_the_progress_write_and_keep_each_job_s_own_time(redis_client, monkeypatch):
    # A batch with first tokens writes nothing to the database: the batches queued behind it (the
    # next admission's first tokens, on a burst) would wait for that UPDATE. The times go out with
    # the next progress write, each job's own (batches the output process merged hold several).
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from engine_worker.protocol import FirstToken

    clock = Clock()
    monkeypatch.setattr(sink_module.time, "monotonic", clock)
    early, late = (str(make_job(status=JobStatus.IN_PROGRESS, worker_id="w").id) for _ in range(2))
    sink = RedisJobSink(worker_id="w", redis_client=redis_client, progress_interval_s=1.0)

    def chunks(seq: int) -> tuple[OutputChunk, ...]:
        return tuple(OutputChunk(job_id=j, seq=seq, text=f"<{seq}>", completion_tokens=seq) for j in (early, late))

    with CaptureQueriesContext(connection) as queries:
        sink.publish(StepBatch(chunks=chunks(1), first_tokens=(FirstToken(job_id=early, at=1_800_000_000.0),
                                                               FirstToken(job_id=late, at=1_800_000_000.5))))
    assert queries.captured_queries == []
    assert not Job.objects.filter(first_token_at__isnull=False).exists()

    clock.now += 1.0
    sink.publish(StepBatch(chunks=chunks(2)))
    times = {str(j.id): j.first_token_at.timestamp() for j in Job.objects.filter(id__in=[early, late])}
    assert times == {early: 1_800_000_000.0, late: 1_800_000_000.5}
    assert Job.objects.get(id=early).output_text == "<1><2>"


def test_a_job_that_finishes_before_the_progress_write_gets_its_first_token_time_with_its_final(redis_client):
    from engine_worker.protocol import FinalResult, FirstToken

    job_id = str(make_job(status=JobStatus.IN_PROGRESS, worker_id="w").id)
    sink = RedisJobSink(worker_id="w", redis_client=redis_client, progress_interval_s=60.0)
    sink.publish(StepBatch(chunks=(OutputChunk(job_id=job_id, seq=1, text="a", completion_tokens=1),),
                           first_tokens=(FirstToken(job_id=job_id, at=1_800_000_000.0),)))
    sink.publish(StepBatch(finals=(FinalResult(job_id=job_id, text="ab", finish_reason="length", prompt_tokens=3,
                                               completion_tokens=2, first_token_at=1_800_000_000.0,
                                               finished_at=1_800_000_001.0, last_seq=2),)))
    row = Job.objects.get(id=job_id)
    assert (row.status, row.output_text) == (JobStatus.COMPLETED, "ab")
    assert row.first_token_at.timestamp() == 1_800_000_000.0
    assert sink._first_at == {}  # nothing left to write for it
