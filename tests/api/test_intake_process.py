"""The engine worker's intake process (api/streaming/intake_process.py) consumes the engine queue,
claims the jobs for its worker and passes their specs to it (api/streaming/intake.py); it knows
the worker's room from what the worker releases, stops when the worker closes its stdin, and the
worker restarts a child that dies, up to a point."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import pytest
from django.conf import settings
from django.db import connection

from api.models import Job, JobStatus
from api.streaming import intake_admission, intake_process, sink_process
from api.streaming.claimer import ClaimedJobs, Claimer
from api.streaming.intake import MAX_RESTARTS, IntakeProcess
from api.tasks import ENGINE_QUEUE, run_job
from engine_worker.protocol import JobSpec
from inference_service.celery import app
from tests.api.factories import make_job
from tests.integration.procs import exited, wait_for

postgres_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="claims ahead on PostgreSQL")


class Started:
    def __init__(self) -> None:
        self.specs: list[JobSpec] = []
        self._lock = threading.Lock()

    def __call__(self, spec: JobSpec) -> None:
        with self._lock:
            self.specs.append(spec)

    @property
    def ids(self) -> list[str]:
        with self._lock:
            return [spec.job_id for spec in self.specs]


def _child_env() -> dict[str, str]:
    db = connection.settings_dict
    url = (f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}" if connection.vendor == "postgresql"
           else f"sqlite:///{db['NAME']}")
    return {**os.environ, "REDIS_URL": settings.REDIS_URL, "DATABASE_URL": url}


def _intake(worker_id: str, **argv_options) -> IntakeProcess:
    argv = intake_process.argv(worker_id, prefetch=4, pool="solo", concurrency=1, loglevel="INFO", **argv_options)
    return IntakeProcess(argv, env=_child_env(), cwd=sink_process.project_root())


def _statuses(jobs: list[Job]) -> list[tuple[str, str | None]]:
    rows = {str(j.id): (j.status, j.worker_id) for j in Job.objects.filter(id__in=[j.id for j in jobs])}
    return [rows[str(j.id)] for j in jobs]


def _spec_line(job_id: str) -> str:
    return json.dumps({"job_id": job_id, "prompt_token_ids": [1, 2], "max_tokens": 4})


def test_jobs_sent_to_the_engine_queue_are_claimed_by_the_child_and_reach_the_worker_as_specs(
        transactional_db, redis_client):
    jobs = [make_job(prompt_token_ids=[5, 6, i + 7]) for i in range(3)]
    intake = _intake("w-intake")
    started = Started()
    intake.start()
    intake.serve(started)
    try:
        # A connection of its own: the app's pooled one would remember the queue as declared
        # after the flush of the next test's Redis (test_warmup.py checks the declaration).
        with app.connection_for_write() as broker:
            for job in jobs:
                run_job.apply_async(args=[str(job.id)], queue=ENGINE_QUEUE, connection=broker)
        wait_for(lambda: len(started.specs) == 3, 120, "the claimed jobs through the intake process")
    finally:
        pid = intake.pid
        stopping = time.monotonic()
        assert intake.stop(60)
    assert exited(pid) and time.monotonic() - stopping < 30
    assert started.ids == [str(job.id) for job in jobs]
    assert [spec.prompt_token_ids for spec in started.specs] == [(5, 6, 7), (5, 6, 8), (5, 6, 9)]
    assert started.specs[0].max_tokens == 16
    assert _statuses(jobs) == [(JobStatus.IN_PROGRESS, "w-intake")] * 3  # claimed for the worker
    assert redis_client.llen("engine") == 0  # every message was taken (and acknowledged)


@postgres_only
def test_the_child_claims_at_the_databases_notice_only_as_far_as_the_worker_has_room(transactional_db):
    jobs = [make_job() for _ in range(3)]  # committed, never dispatched: only the notice can wake the child
    intake = _intake("w-room", listen=True, claim_ahead=2)
    started = Started()
    intake.start()
    intake.serve(started)
    try:
        deadline = time.monotonic() + 120
        while len(started.specs) < 2 and time.monotonic() < deadline:
            make_job(priority=20)  # another notice (last in the queue's order) until it listens
            time.sleep(0.5)
        assert started.ids == [str(jobs[0].id), str(jobs[1].id)]  # the queue's head, 2 of them
        make_job(priority=20)  # a notice while full: nothing more
        time.sleep(1.0)
        assert len(started.specs) == 2

        intake.release(str(jobs[0].id))  # it finished: room for one more at the next notice
        make_job(priority=20)
        wait_for(lambda: len(started.specs) == 3, 30, "a claim into the released room")
        time.sleep(0.5)
        assert started.ids[2] == str(jobs[2].id) and len(started.specs) == 3
    finally:
        assert intake.stop(60)
    assert _statuses(jobs) == [(JobStatus.IN_PROGRESS, "w-room")] * 3


@postgres_only
def test_a_child_started_again_is_told_what_the_worker_holds_and_claims_no_more(transactional_db):
    intake = _intake("w-restart", listen=True, claim_ahead=2)
    started = Started()
    intake.start()
    intake.serve(started, held_jobs=lambda: ["held-a", "held-b"])  # a full worker
    try:
        first = intake.pid
        os.kill(first, 9)
        wait_for(lambda: intake.pid != first, 30, "a new intake process")
        job = make_job()
        time.sleep(3.0)  # the new child listens and hears notices: none of them is claimed
        make_job()
        time.sleep(1.0)
        assert started.specs == []

        intake.release("held-a")
        wait_for(lambda: make_job(priority=20) and len(started.specs) == 1, 60, "a claim once the worker has room")
        assert started.ids == [str(job.id)]
    finally:
        assert intake.stop(60)


def test_a_child_whose_worker_is_gone_hands_the_claimed_jobs_back_and_stops(db, monkeypatch):
    job = make_job()
    read_end, write_end = os.pipe()
    os.close(read_end)
    sent_back: list[str] = []
    stopped: list[bool] = []
    monkeypatch.setattr(intake_admission, "_send_back", sent_back.append)
    monkeypatch.setattr(intake_admission, "stop_consuming", lambda: stopped.append(True))
    claimed = ClaimedJobs()
    admission = intake_admission.IntakeAdmission(
        os.fdopen(write_end, "wb"), claimer=Claimer(worker_id="w-gone", lease_s=30, claim_ahead=0, held=claimed),
        claimed=claimed)

    assert admission._claim_and_send([str(job.id)]) is True

    job.refresh_from_db()
    assert (job.status, job.worker_id) == (JobStatus.QUEUED, None)  # for another worker
    assert sent_back == [str(job.id)] and stopped == [True]
    assert claimed.held_count() == 0
    assert admission.wake() is False  # nobody to claim for: the listener stops


def test_the_childs_account_follows_the_workers_lines_and_it_stops_at_end_of_file():
    claimed = ClaimedJobs()
    claimed.add("a")
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "wb") as pipe:
        pipe.write(b"held b\nheld c\nreleased a\nreleased nobody\nnonsense\n\nreleased c\n")
    ended: list[bool] = []
    with os.fdopen(read_end, "rb") as stream:
        intake_process.follow_worker(stream, claimed, lambda: ended.append(True))
    assert ended == [True]
    assert (claimed.held_count(), claimed.holds("b"), claimed.holds("a")) == (1, True, False)


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_specs_written_while_the_child_stops_are_still_started():
    # The child writes one spec, and one more once its stdin is closed (a claim in hand that it
    # finishes): stop() returns only after the reader has passed both on.
    code = (f"import sys; print({_spec_line('first')!r}, flush=True); sys.stdin.read(); "
            f"print({_spec_line('last')!r})")
    intake = IntakeProcess(_python(code))
    started = Started()
    intake.start()
    intake.serve(started)
    wait_for(lambda: started.ids == ["first"], 30, "the first spec")
    assert intake.stop(30)
    assert started.ids == ["first", "last"]
    assert started.specs[0] == JobSpec(job_id="first", prompt_token_ids=(1, 2), max_tokens=4)


def test_a_malformed_line_is_skipped_and_the_specs_after_it_still_start():
    code = f"print('not json'); print('[1]'); print({_spec_line('after')!r})"
    intake = IntakeProcess(_python(code), on_failure=lambda: None)
    started = Started()
    intake.start()
    intake.serve(started)
    wait_for(lambda: "after" in started.ids, 30, "the spec after the bad lines")
    intake.stop(10)
    assert set(started.ids) == {"after"}


def test_a_child_that_dies_is_replaced_and_one_that_keeps_dying_stops_the_worker():
    failures: list[int] = []
    intake = IntakeProcess(_python(f"print({_spec_line('a')!r}); print({_spec_line('b')!r})"),
                           on_failure=lambda: failures.append(1))
    started = Started()
    intake.start()
    intake.serve(started)
    wait_for(lambda: failures, 30, "the intake to give up")
    intake.stop(10)
    # Every child's specs were started before it was replaced; the last start gave up, once.
    assert started.ids == ["a", "b"] * MAX_RESTARTS
    assert failures == [1]


def test_a_child_that_cannot_be_started_again_stops_the_worker():
    failures: list[int] = []
    intake = IntakeProcess(_python("import sys; sys.stdin.read()"), on_failure=lambda: failures.append(1))
    intake.start()
    intake.serve(Started())
    intake._argv = ["/nonexistent/python"]  # what a restart would run can no longer start
    os.kill(intake.pid, 9)
    wait_for(lambda: failures, 30, "the intake to give up")
    intake.stop(10)
    assert failures == [1]
