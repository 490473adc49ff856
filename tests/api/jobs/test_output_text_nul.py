"""Generated text is stored exactly, NUL included (PostgreSQL's text refuses NUL), and reads back
the same through every reader: the ORM, ``values()``, REST, the stream."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from api.common.redis_keys import job_stream_key
from api.jobs.fields import decode_text, encode_text
from api.jobs.services import outputs
from api.models import Job, JobStatus
from api.worker.sink import RedisJobSink
from engine_worker.protocol import FinalResult, OutputChunk, StepBatch
from tests.api.factories import make_job

ROOT = Path(__file__).resolve().parents[3]
# NUL, the escape character alone, escaped-looking sequences, and both at the ends.
TRICKY = ["\x00", "a\x00b", "\uffff", "\uffff0", "\uffff\uffff", "\x00\uffff\x00", "0\uffff", "x\uffff\x00\uffff0\x00"]


@pytest.mark.parametrize("text", [*TRICKY, "", "plain text", "ünïcödé ✓ 🙂\n\t\\0"])
def test_every_string_reads_back_exactly_and_its_stored_form_has_no_nul(text):
    stored = encode_text(text)
    assert "\x00" not in stored
    assert decode_text(stored) == text


def test_text_without_nul_or_the_escape_character_is_stored_unchanged():
    text = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # \\x00 \\uffff"
    assert encode_text(text) is text


def _final(job: Job, text: str) -> FinalResult:
    return FinalResult(job_id=str(job.id), text=text, finish_reason="length", prompt_tokens=3,
                       completion_tokens=4, finished_at=time.time(), last_seq=4)


@pytest.mark.django_db
def test_finals_and_progress_holding_nul_are_stored_next_to_ordinary_jobs_and_read_back_exactly(api_client, api_key):
    jobs = [make_job(api_key=api_key, status=JobStatus.IN_PROGRESS, worker_id="w") for _ in range(4)]
    texts = ["ab\x00cd\uffff0", "ordinary one", "another\n", "\x00"]
    progress = [outputs.Progress(job_id=str(job.id), text=text[:3], last_seq=1, completion_tokens=1)
                for job, text in zip(jobs, texts, strict=True)]
    assert outputs.jobs_record_progress(worker_id="w", progress=progress) == 4
    assert [Job.objects.get(id=job.id).output_text for job in jobs] == [text[:3] for text in texts]

    written = outputs.jobs_complete(results=[_final(job, text) for job, text in zip(jobs, texts, strict=True)],
                               worker_id="w")

    assert sorted(written) == sorted(str(job.id) for job in jobs)
    for job, text in zip(jobs, texts, strict=True):
        assert Job.objects.get(id=job.id).output_text == text
        assert Job.objects.filter(id=job.id).values_list("output_text", flat=True).get() == text
        body = api_client.get(f"/api/v1/jobs/{job.id}").json()
        assert (body["status"], body["output_text"]) == ("completed", text)
    listed = {row["id"]: row["output_text"] for row in api_client.get("/api/v1/jobs").json()["results"]}
    assert listed == {str(job.id): text for job, text in zip(jobs, texts, strict=True)}  # the list too
    with connection.cursor() as cursor:  # no NUL reaches the column, on any database
        cursor.execute(f"SELECT output_text FROM {Job._meta.db_table} WHERE id = %s",
                       [Job._meta.pk.get_db_prep_value(jobs[0].id, connection)])
        assert cursor.fetchone()[0] == "ab\uffff0cd\uffff\uffff0"


@pytest.mark.django_db
def test_a_job_streaming_nul_ends_with_the_same_text_in_the_row_and_the_stream_next_to_ordinary_jobs(redis_client):
    from api.jobs.selectors import job_streamed_text

    nul, ordinary = (make_job(status=JobStatus.IN_PROGRESS, worker_id="w") for _ in range(2))
    sink = RedisJobSink(worker_id="w", redis_client=redis_client, progress_interval_s=0.0)
    pieces = {str(nul.id): ["x", "\x00", "\x00y"], str(ordinary.id): ["a", "b", "c"]}
    for seq in (1, 2, 3):
        chunks = tuple(OutputChunk(job_id=job_id, seq=seq, text=texts[seq - 1], completion_tokens=seq)
                       for job_id, texts in pieces.items())
        finals = (tuple(FinalResult(job_id=job_id, text="".join(texts), finish_reason="length", prompt_tokens=3,
                                    completion_tokens=3, finished_at=time.time(), last_seq=3)
                        for job_id, texts in pieces.items()) if seq == 3 else ())
        sink.publish(StepBatch(chunks=chunks, finals=finals))

    for job_id, texts in pieces.items():
        row = Job.objects.get(id=job_id)
        assert (row.status, row.output_text) == (JobStatus.COMPLETED, "".join(texts))
        assert job_streamed_text(job_id=job_id) == row.output_text
    finals = [json.loads(f["data"])["status"] for job_id in pieces
              for _, f in redis_client.xrange(job_stream_key(job_id)) if f["type"] == "final"]
    assert finals == ["completed"] * 2


@pytest.mark.django_db(transaction=True)
def test_migration_0008_keeps_every_existing_row_s_text_exactly():
    executor = MigrationExecutor(connection)
    executor.migrate([("api", "0007_job_logprobs")])
    try:
        old = MigrationExecutor(connection).loader.project_state([("api", "0007_job_logprobs")]).apps
        OldJob, OldUser = old.get_model("api", "Job"), old.get_model("auth", "User")  # noqa: N806
        owner = OldUser.objects.create(username="before-0008")
        texts = ["plain", "holds \uffff the escape", "\uffff0 looks escaped", "\uffff\uffff", ""]
        ids = [OldJob.objects.create(owner=owner, output_text=text, prompt_token_ids=[1], params={}).id
               for text in texts]
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert [Job.objects.get(id=job_id).output_text for job_id in ids] == texts


SQLITE_SCRIPT = """
import json, time
from api.models import Job
from api.jobs.services import outputs
from engine_worker.protocol import FinalResult
from tests.api.factories import make_job
jobs = [make_job(status="in_progress", worker_id="w") for _ in range(3)]
texts = ["a\\x00b\\uffff0", "plain", "\\x00"]
outputs.jobs_record_progress(worker_id="w", progress=[
    outputs.Progress(job_id=str(j.id), text=t, last_seq=1, completion_tokens=1) for j, t in zip(jobs, texts)])
progress = [Job.objects.get(id=j.id).output_text for j in jobs]
written = outputs.jobs_complete(results=[FinalResult(job_id=str(j.id), text=t + "!", finish_reason="stop", prompt_tokens=1,
                                                completion_tokens=2, finished_at=time.time(), last_seq=2)
                                    for j, t in zip(jobs, texts)], worker_id="w")
print(json.dumps({"progress": progress, "written": len(written),
                  "final": [Job.objects.get(id=j.id).output_text for j in jobs]}))
"""


def test_text_holding_nul_is_stored_exactly_on_sqlite(migrated_sqlite_url, tiny_model_path):
    env = {**os.environ, "DATABASE_URL": migrated_sqlite_url, "MODEL_PATH": str(tiny_model_path),
           "DJANGO_SETTINGS_MODULE": "inference_service.settings"}
    run = lambda *args: subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,  # noqa: E731
                                       capture_output=True, text=True, timeout=120)
    out = run("shell", "-c", SQLITE_SCRIPT)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    texts = ["a\x00b\uffff0", "plain", "\x00"]
    assert result == {"progress": texts, "written": 3, "final": [t + "!" for t in texts]}
