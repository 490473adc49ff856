from __future__ import annotations

import json
import time
from unittest import mock

import pytest
import redis

from api.common import redis_keys
from api.common.redis_client import channel_db
from api.jobs.services.cancel import job_cancel
from api.models import Job, JobStatus
from tests.api.factories import make_api_key, make_job

pytestmark = pytest.mark.django_db


def test_cancel_of_queued_job_cancels_it_at_once_and_it_can_no_longer_be_claimed(api_client, api_key):
    job = make_job(api_key=api_key)

    response = api_client.post(f"/api/v1/jobs/{job.id}/cancel")

    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    # The worker claims with a conditional UPDATE on status=queued: it now matches nothing.
    assert Job.objects.filter(id=job.id, status=JobStatus.QUEUED).update(status=JobStatus.IN_PROGRESS) == 0
    assert Job.objects.get(id=job.id).finished_at is not None


def test_a_job_cancelled_in_the_queue_is_charged_no_tokens(api_client, api_key):
    job = make_job(api_key=api_key, prompt_tokens=3)

    usage = api_client.post(f"/api/v1/jobs/{job.id}/cancel").json()["usage"]

    assert usage["prompt_tokens"] == usage["total_tokens"] == 0


def test_cancel_of_a_queued_job_puts_its_final_on_the_jobs_stream(
    api_client, api_key, redis_client, django_capture_on_commit_callbacks
):
    job = make_job(api_key=api_key)

    with django_capture_on_commit_callbacks(execute=True):
        assert api_client.post(f"/api/v1/jobs/{job.id}/cancel").status_code == 200

    entries = redis_client.xrange(redis_keys.job_stream_key(str(job.id)))
    assert len(entries) == 1 and entries[0][1]["type"] == "final"
    final = json.loads(entries[0][1]["data"])
    assert final["type"] == "final" and final["job_id"] == str(job.id)
    assert final["status"] == "cancelled" and final["seq"] == 0 and final["usage"]["completion_tokens"] == 0
    assert 0 < redis_client.ttl(redis_keys.job_stream_key(str(job.id)))


def test_cancel_of_a_running_job_leaves_its_final_to_the_worker(
    api_client, api_key, redis_client, django_capture_on_commit_callbacks
):
    job = make_job(api_key=api_key, status=JobStatus.IN_PROGRESS, worker_id="w-1")

    with django_capture_on_commit_callbacks(execute=True):
        assert api_client.post(f"/api/v1/jobs/{job.id}/cancel").status_code == 200

    assert redis_client.exists(redis_keys.job_stream_key(str(job.id))) == 0


def test_cancel_of_a_queued_job_with_redis_down_still_cancels_it(api_client, api_key, django_capture_on_commit_callbacks):
    job = make_job(api_key=api_key)
    with mock.patch("api.streaming.job_end.get_redis", side_effect=redis.ConnectionError("down")), \
            django_capture_on_commit_callbacks(execute=True):
        response = api_client.post(f"/api/v1/jobs/{job.id}/cancel")

    assert response.status_code == 200 and Job.objects.get(id=job.id).status == JobStatus.CANCELLED


def test_cancel_of_running_job_flags_it_and_tells_the_workers_on_the_cancel_channel(
    api_client, api_key, redis_client, django_capture_on_commit_callbacks
):
    job = make_job(api_key=api_key, status=JobStatus.IN_PROGRESS, worker_id="w-1")
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(redis_keys.cancel_channel(channel_db(redis_client)))
    pubsub.get_message(timeout=1)

    with django_capture_on_commit_callbacks(execute=True):
        response = api_client.post(f"/api/v1/jobs/{job.id}/cancel")

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "in_progress" and body["cancel_requested"] is True
    message = None
    deadline = time.monotonic() + 2
    while message is None and time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.2)
    pubsub.close()
    assert message is not None and json.loads(message["data"]) == {"job_id": str(job.id)}


def test_cancel_of_a_completed_job_is_409(api_client, api_key):
    job = make_job(api_key=api_key, status=JobStatus.COMPLETED)

    response = api_client.post(f"/api/v1/jobs/{job.id}/cancel")

    assert response.status_code == 409 and response.json()["error"]["code"] == "job_not_cancellable"


def test_cancelling_a_cancelled_job_again_is_a_no_op(api_client, api_key):
    job = make_job(api_key=api_key, status=JobStatus.CANCELLED)

    assert api_client.post(f"/api/v1/jobs/{job.id}/cancel").status_code == 200


def test_cancel_of_another_users_job_is_404_and_leaves_it_alone(api_client):
    job = make_job(api_key=make_api_key()[0])

    assert api_client.post(f"/api/v1/jobs/{job.id}/cancel").status_code == 404
    assert Job.objects.get(id=job.id).status == JobStatus.QUEUED


def test_operator_cancel_without_owner_works_on_any_job():
    job = make_job()
    assert job_cancel(job_id=job.id).status == JobStatus.CANCELLED
