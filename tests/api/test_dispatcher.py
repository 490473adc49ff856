"""New jobs are published from the dispatcher thread, after the response, with nothing lost."""

from __future__ import annotations

import threading
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
