"""New jobs are published from the dispatcher thread, after the response, with nothing lost."""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from unittest import mock

import pytest

from api.models import Job, JobStatus
from api.services.dispatcher import dispatcher
from tests.api.conftest import fake_tasks_module

pytestmark = pytest.mark.django_db(transaction=True)  # the dispatcher thread has its own connection


@pytest.fixture(autouse=True)
def _dispatch_thread(settings):
    settings.JOB_DISPATCH_THREAD = True


def _recording_task(on_send=None):
    sent: list[tuple[str, str]] = []

    def delay(job_id: str) -> None:
        if on_send is not None:
            on_send()
        sent.append((job_id, threading.current_thread().name))

    return mock.Mock(delay=mock.Mock(side_effect=delay)), sent


@contextmanager
def recording_tasks_module(on_send=None):
    """``api.tasks`` with run_job and run_jobs recording each message: a list of ids per send."""
    messages: list[list[str]] = []

    def record(job_ids: list[str]) -> None:
        if on_send is not None:
            on_send()
        messages.append(list(job_ids))

    fake = mock.Mock(run_job=mock.Mock(delay=mock.Mock(side_effect=lambda job_id: record([job_id]))),
                     run_jobs=mock.Mock(delay=mock.Mock(side_effect=record)))
    with mock.patch.dict(sys.modules, {"api.tasks": fake}):
        yield messages


def test_a_submission_is_published_from_the_dispatcher_thread(api_client):
    task, sent = _recording_task()
    with fake_tasks_module(task):
        response = api_client.post("/api/v1/jobs", {"prompt": "Hi", "max_tokens": 4}, format="json")
        assert dispatcher.flush(timeout=10)

    assert response.status_code == 202
    assert sent == [(response.json()["id"], "job-dispatcher")]
    assert Job.objects.get(id=response.json()["id"]).dispatch_count == 1


def test_the_response_does_not_wait_for_the_broker(api_client):
    release = threading.Event()
    task, sent = _recording_task(on_send=lambda: release.wait(10))
    with fake_tasks_module(task):
        response = api_client.post("/api/v1/jobs", {"prompt": "Hi", "max_tokens": 4}, format="json")
        assert response.status_code == 202 and sent == []  # answered while the send is blocked
        assert not dispatcher.flush(timeout=0.2)
        release.set()
        assert dispatcher.flush(timeout=10)

    assert [job_id for job_id, _ in sent] == [response.json()["id"]]


def test_a_failed_send_on_the_thread_leaves_the_job_queued_for_the_reconciler(api_client):
    broken = mock.Mock()
    broken.delay.side_effect = ConnectionError("broker down")
    with fake_tasks_module(broken):
        response = api_client.post("/api/v1/jobs", {"prompt": "Hi", "max_tokens": 4}, format="json")
        assert dispatcher.flush(timeout=10)

    job = Job.objects.get(id=response.json()["id"])
    assert response.status_code == 202
    assert job.status == JobStatus.QUEUED and job.dispatch_count == 0  # not counted as sent


def test_a_burst_is_sent_in_submission_order(api_client):
    task, sent = _recording_task()
    with fake_tasks_module(task):
        ids = [api_client.post("/api/v1/jobs", {"prompt": f"Hi {i}", "max_tokens": 4}, format="json").json()["id"]
               for i in range(5)]
        assert dispatcher.flush(timeout=10)

    assert [job_id for job_id, _ in sent] == ids


def test_ids_that_queue_up_during_a_send_go_out_together_eight_at_most(api_client):
    release, first_send = threading.Event(), threading.Event()

    def hold_the_first_send() -> None:
        first_send.set()
        release.wait(10)

    with recording_tasks_module(on_send=hold_the_first_send) as messages:
        ids = [api_client.post("/api/v1/jobs", {"prompt": "Hi", "max_tokens": 4}, format="json").json()["id"]]
        assert first_send.wait(10)  # the thread is inside its first send...
        ids += [api_client.post("/api/v1/jobs", {"prompt": f"Hi {i}", "max_tokens": 4}, format="json").json()["id"]
                for i in range(19)]  # ...while 19 more submissions queue up
        release.set()
        assert dispatcher.flush(timeout=10)

    assert messages == [ids[:1], ids[1:9], ids[9:17], ids[17:]]
    assert set(Job.objects.values_list("dispatch_count", flat=True)) == {1}


def test_a_failed_batch_send_takes_back_every_count(api_client):
    release, first_send = threading.Event(), threading.Event()
    calls = 0

    def fail_the_batch() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            first_send.set()
            release.wait(10)
        else:
            raise ConnectionError("broker down")

    with recording_tasks_module(on_send=fail_the_batch):
        first = api_client.post("/api/v1/jobs", {"prompt": "Hi", "max_tokens": 4}, format="json").json()["id"]
        assert first_send.wait(10)
        rest = [api_client.post("/api/v1/jobs", {"prompt": f"Hi {i}", "max_tokens": 4}, format="json").json()["id"]
                for i in range(3)]
        release.set()
        assert dispatcher.flush(timeout=10)

    assert Job.objects.get(id=first).dispatch_count == 1
    assert [Job.objects.get(id=job_id).dispatch_count for job_id in rest] == [0, 0, 0]  # left to the reconciler


def test_start_runs_the_dispatcher_thread_before_any_submission(settings):
    from api.services.dispatcher import JobDispatcher

    fresh = JobDispatcher()
    settings.JOB_DISPATCH_THREAD = False
    fresh.start()
    assert fresh._thread is None  # publishing on the request's thread: no thread to start

    settings.JOB_DISPATCH_THREAD = True
    fresh.start()
    thread = fresh._thread
    assert thread is not None and thread.is_alive() and thread.name == "job-dispatcher"
    fresh.start()
    assert fresh._thread is thread  # started once
