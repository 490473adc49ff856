"""The engine worker's output process (api/streaming/sink_process.py) writes what the worker pipes
to it: finals and first tokens to the database, chunks to the job's Redis stream, and it is done
once ``close`` returns."""

from __future__ import annotations

import os
import time

import pytest
from django.conf import settings
from django.db import connection

from api.keys import job_stream_key
from api.models import Job, JobStatus
from api.streaming import sink_process
from engine_worker.protocol import FinalResult, FirstToken, OutputChunk, StepBatch
from engine_worker.runtime.pipe_sink import PipeSink
from tests.api.factories import make_job


def _child_env() -> dict[str, str]:
    """The test database (pytest-django renamed it in this process only) and the test Redis."""
    db = connection.settings_dict
    if connection.vendor == "postgresql":
        url = f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    else:
        pytest.skip("the child reaches the test database by URL (PostgreSQL)")
    return {**os.environ, "DATABASE_URL": url, "REDIS_URL": settings.REDIS_URL, "DB_POOL": "0"}


def test_the_output_process_writes_streams_first_tokens_and_finals(transactional_db, redis_client):
    job = make_job(status=JobStatus.IN_PROGRESS, worker_id="w-out")
    job_id = str(job.id)
    sink = PipeSink(sink_process.argv("w-out"), env=_child_env(), cwd=sink_process.project_root())
    sink.start()
    first_at = time.time()

    sink.publish(StepBatch(chunks=(OutputChunk(job_id=job_id, seq=1, text="Hel", completion_tokens=1),),
                           first_tokens=(FirstToken(job_id=job_id, at=first_at),)))
    sink.publish(StepBatch(
        chunks=(OutputChunk(job_id=job_id, seq=2, text="lo", completion_tokens=2),),
        finals=(FinalResult(job_id=job_id, text="Hello", finish_reason="stop", prompt_tokens=3,
                            completion_tokens=2, first_token_at=first_at, finished_at=time.time(), last_seq=2),)))
    assert sink.close(timeout=60)

    row = Job.objects.get(id=job_id)
    assert row.status == JobStatus.COMPLETED and row.output_text == "Hello" and row.completion_tokens == 2
    assert row.first_token_at is not None and abs(row.first_token_at.timestamp() - first_at) < 1e-3
    entries = redis_client.xrange(job_stream_key(job_id))
    assert [fields["type"] for _, fields in entries] == ["delta", "delta", "final"]
