"""Durability with real parts: the DB row is the truth, the broker only delivers.

Workers are subprocesses on the Postgres test DB and the Redis test DB; leases and re-dispatch
delays are shortened through the environment (see conftest.FAST_ENV). The reconciler runs in
the test process (what celery beat would run every 10 s), called in the polling loop. The
black-box drills of the whole service (Redis flushed, workers killed with many jobs in flight,
database connections terminated, on PostgreSQL and SQLite) are in tests/drills/."""

from __future__ import annotations

import json
import time

import pytest

from api.common.redis_keys import job_stream_key, worker_heartbeat_key
from api.jobs.tasks import reconcile_jobs
from api.models import JobStatus
from tests.integration.jobs import job, queue_job, wait_status, wait_streaming
from tests.integration.procs import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_job_of_a_worker_killed_with_sigkill_completes_on_a_new_worker(workers, redis_db):
    first = workers.start("w-killed")
    job_id = queue_job("Once upon a time", max_tokens=1200)
    wait_streaming(redis_db, job_id, first)
    assert job(job_id).worker_id == "w-killed"
    # The live worker's heartbeat names it, its model and device, and what it runs; its lease on
    # the job keeps moving forward.
    lease = job(job_id).lease_expires_at
    beat = wait_for(lambda: _heartbeat_running(redis_db, "w-killed", job_id), 30, "a heartbeat with the job")
    assert beat["model"] == "tiny" and beat["device"] == "cpu" and beat["memory"]["active_bytes"] > 0
    wait_for(lambda: job(job_id).lease_expires_at > lease, 30, "the lease to be renewed")
    first.kill9()

    # Nothing finishes it while no worker holds the lease: it stays in_progress until the lease
    # expires and the reconciler hands it on.
    assert job(job_id).status == JobStatus.IN_PROGRESS
    workers.start("w-new")
    done = wait_status(job_id, (JobStatus.COMPLETED,), tick=reconcile_jobs)
    assert done.worker_id == "w-new"
    assert done.completion_tokens == 1200
    assert done.finish_reason == "length"
    assert done.attempts == 2
    # The stream holds exactly the new attempt: a reset past every seq of the first, then its
    # chunks numbered on from there, whose text is the stored text.
    entries = [fields for _, fields in redis_db.xrange(job_stream_key(job_id))]
    assert entries[0]["type"] == "reset"
    deltas = [f for f in entries if f["type"] == "delta"]
    reset_seq = int(entries[0]["seq"])
    assert reset_seq > 3 and [int(f["seq"]) for f in deltas] == list(range(reset_seq + 1, done.last_seq + 1))
    assert "".join(f["text"] for f in deltas) == done.output_text


def _heartbeat_running(redis_db, worker_id: str, job_id: str) -> dict | None:
    raw = redis_db.get(worker_heartbeat_key(worker_id))
    beat = json.loads(raw) if raw else None
    if beat and beat["num_running"] == 1 and [r["request_id"] for r in beat["requests"]] == [job_id]:
        return beat
    return None


def test_duplicate_delivery_of_a_running_job_does_nothing(workers, redis_db):
    workers.start("w-dup")
    job_id = queue_job("Once upon a time", max_tokens=200)
    wait_status(job_id, (JobStatus.IN_PROGRESS, JobStatus.COMPLETED))
    from api.jobs.services.dispatch import job_dispatch_counted

    job_dispatch_counted(job_id=job_id)  # a second delivery while (or after) it runs
    done = wait_status(job_id, (JobStatus.COMPLETED,))
    time.sleep(1.0)
    again = job(job_id)
    assert (again.status, again.output_text, again.completion_tokens) == (
        JobStatus.COMPLETED, done.output_text, 200)
    deltas = [f for _, f in redis_db.xrange(job_stream_key(job_id)) if f["type"] == "delta"]
    assert "".join(f["text"] for f in deltas) == done.output_text


def test_sigterm_drains_briefly_hands_back_the_rest_and_exits_cleanly(workers, redis_db):
    leaving = workers.start("w-leaving", WORKER_DRAIN_S="0.5")
    short_id = queue_job("Dear diary,", max_tokens=8)
    wait_status(short_id, (JobStatus.COMPLETED,))
    # Long enough to outlast the shutdown on an idle machine (the tiny model makes ~500 tokens/s
    # alone, and Celery's warm shutdown alone takes ~1.5 s).
    long_id = queue_job("Once upon a time", max_tokens=3000)
    wait_streaming(redis_db, long_id, leaving)
    started = time.monotonic()
    assert leaving.stop(timeout=60) == 0, leaving.log_tail()
    assert time.monotonic() - started < 30
    handed_back = job(long_id)
    assert handed_back.status == JobStatus.QUEUED and handed_back.worker_id is None
    assert b"1 jobs handed back" in leaving.log_path.read_bytes()
    # It was re-dispatched on the way out: the next worker takes it without the reconciler.
    workers.start("w-taking-over")
    done = wait_status(long_id, (JobStatus.COMPLETED,))
    assert (done.worker_id, done.completion_tokens) == ("w-taking-over", 3000)
