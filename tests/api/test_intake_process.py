"""The engine worker's intake process (api/streaming/intake_process.py) consumes the engine queue
and passes each job id to the worker (api/streaming/intake.py), which admits it; it stops when the
worker closes its stdin, and the worker restarts a child that dies, up to a point."""

from __future__ import annotations

import os
import sys
import threading
import time

from django.conf import settings

from api.streaming import intake_process, sink_process
from api.streaming.intake import MAX_RESTARTS, IntakeProcess
from api.tasks import dispatch_job
from tests.integration.procs import exited, wait_for


class Admitted:
    def __init__(self) -> None:
        self.ids: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, job_id: str) -> bool:
        with self._lock:
            self.ids.append(job_id)
        return True


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_job_ids_sent_to_the_engine_queue_reach_the_worker_and_the_child_stops_at_end_of_its_stdin(redis_client):
    env = {**os.environ, "REDIS_URL": settings.REDIS_URL}
    intake = IntakeProcess(intake_process.argv("w-intake", prefetch=4, pool="solo", concurrency=1, loglevel="INFO"),
                           env=env, cwd=sink_process.project_root())
    admitted = Admitted()
    intake.start()
    intake.serve(admitted)
    try:
        for job_id in ("job-a", "job-b", "job-c"):
            dispatch_job(job_id)
        wait_for(lambda: admitted.ids == ["job-a", "job-b", "job-c"], 120, "the ids through the intake process")
    finally:
        pid = intake.pid
        started = time.monotonic()
        assert intake.stop(60)
    assert exited(pid) and time.monotonic() - started < 30
    assert redis_client.llen("engine") == 0  # every message was taken (and acknowledged)


def test_ids_written_while_the_child_stops_are_still_admitted():
    # The child writes one id, and one more once its stdin is closed (a message in hand that the
    # warm shutdown finishes): stop() returns only after the reader has passed both on.
    intake = IntakeProcess(_python("import sys; print('first', flush=True); sys.stdin.read(); print('last')"))
    admitted = Admitted()
    intake.start()
    intake.serve(admitted)
    wait_for(lambda: admitted.ids == ["first"], 30, "the first id")
    assert intake.stop(30)
    assert admitted.ids == ["first", "last"]


def test_a_child_that_dies_is_replaced_and_one_that_keeps_dying_stops_the_worker():
    failures: list[int] = []
    intake = IntakeProcess(_python("print('a'); print('b')"), on_failure=lambda: failures.append(1))
    admitted = Admitted()
    intake.start()
    intake.serve(admitted)
    wait_for(lambda: failures, 30, "the intake to give up")
    intake.stop(10)
    # Every child's ids were admitted before it was replaced; the last start gave up, once.
    assert admitted.ids == ["a", "b"] * MAX_RESTARTS
    assert failures == [1]


def test_a_child_that_cannot_be_started_again_stops_the_worker():
    failures: list[int] = []
    intake = IntakeProcess(_python("import sys; sys.stdin.read()"), on_failure=lambda: failures.append(1))
    admitted = Admitted()
    intake.start()
    intake.serve(admitted)
    intake._argv = ["/nonexistent/python"]  # what a restart would run can no longer start
    os.kill(intake.pid, 9)
    wait_for(lambda: failures, 30, "the intake to give up")
    intake.stop(10)
    assert failures == [1]


def test_a_child_whose_worker_is_gone_sends_the_job_back_and_stops(monkeypatch):
    read_end, write_end = os.pipe()
    os.close(read_end)
    sent_back: list[str] = []
    stopped: list[bool] = []
    monkeypatch.setattr(intake_process, "_send_back", sent_back.append)
    monkeypatch.setattr(intake_process, "_stop_consuming", lambda: stopped.append(True))
    forwarder = intake_process.Forwarder(os.fdopen(write_end, "wb"))

    assert forwarder.admit("job-x") is False
    assert sent_back == ["job-x"] and stopped == [True]
