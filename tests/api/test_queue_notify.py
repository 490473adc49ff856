"""PostgreSQL tells engine workers when jobs are queued (migration 0003), and the worker's intake
passes that on as a wake-up (api/streaming/queue_listener.py), so a worker with room claims the
queue's head without waiting for the jobs' Celery messages."""

from __future__ import annotations

import os
import threading
import time

import pytest
from django.conf import settings
from django.db import connection

from api.services import job_lifecycle as lc
from api.streaming import intake_process, queue_listener, sink_process
from api.streaming.intake import IntakeProcess
from api.streaming.queue_listener import CHANNEL, QueueListener, django_connect
from tests.api.factories import make_job
from tests.integration.procs import wait_for

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's")


def _notices(conn, wait_s: float) -> int:
    return sum(1 for _ in conn.notifies(timeout=wait_s, stop_after=1))


def test_the_database_notifies_when_a_job_is_queued_or_handed_back_and_not_when_it_is_claimed(transactional_db):
    with django_connect() as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        job = make_job()
        assert _notices(listener, 5) == 1  # inserted (and committed)

        assert lc.job_claim(job_id=str(job.id), worker_id="w1", lease_s=30)
        assert _notices(listener, 0.3) == 0  # queued -> in_progress: nothing to claim

        assert lc.job_requeue(job_id=str(job.id), worker_id="w1", redispatch_after_s=30)
        assert _notices(listener, 5) == 1  # back in the queue


class Calls:
    def __init__(self, result: bool = True) -> None:
        self.count = 0
        self.result = result

    def __call__(self) -> bool:
        self.count += 1
        return self.result


def _notify() -> None:
    with django_connect() as conn:
        conn.execute(f"SELECT pg_notify('{CHANNEL}', '')")


def test_the_listener_survives_a_failed_connection_and_stops_when_nobody_takes_wake_ups(transactional_db, monkeypatch):
    monkeypatch.setattr(queue_listener, "RETRY_S", 0.05)
    attempts: list[int] = []

    def connect():
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("database restarting")
        return django_connect()

    calls = Calls()
    listener = QueueListener(connect, calls)
    listener.start()
    try:
        # Notices sent before it listens again are lost (Celery still delivers): keep sending.
        wait_for(lambda: _notify() or calls.count >= 1, 30, "a wake-up after the failed connection")
        assert len(attempts) == 2
    finally:
        listener.stop(5)

    gone = Calls(result=False)  # the worker's end of the pipe is closed
    listener = QueueListener(django_connect, gone)
    listener.start()
    wait_for(lambda: _notify() or gone.count >= 1, 30, "the wake-up that finds the worker gone")
    listener._thread.join(5)
    assert not listener._thread.is_alive() and gone.count == 1


def test_the_intake_process_passes_a_queued_job_on_as_a_wake_up_before_any_message(transactional_db):
    db = connection.settings_dict
    env = {**os.environ, "REDIS_URL": settings.REDIS_URL,
           "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"}
    argv = intake_process.argv("w-listen", prefetch=4, pool="solo", concurrency=1, loglevel="INFO", listen=True)
    intake = IntakeProcess(argv, env=env, cwd=sink_process.project_root())
    admitted: list[str] = []
    woken = threading.Event()
    intake.start()
    intake.serve(admitted.append, woken.set)
    try:
        deadline = time.monotonic() + 120
        while not woken.is_set() and time.monotonic() < deadline:
            make_job()  # committed, never dispatched: only the database's notice can wake us
            woken.wait(1.0)
        assert woken.is_set(), "no wake-up from the intake process"
        assert admitted == []  # no Celery message was sent
    finally:
        assert intake.stop(60)
