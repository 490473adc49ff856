"""DELETE /api/v1/jobs/<id>: a finished job's content goes for good, its counts stay for the quotas."""

from __future__ import annotations

import asyncio

import pytest
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from api.common import redis_keys
from api.common.errors import JobNotRequeueable
from api.jobs.services.deletion import DROP_JOB_STREAM_TASK
from api.jobs.services.requeue import job_requeue
from api.models import Job, JobStatus
from inference_service.asgi import application
from inference_service.celery import app as celery_app
from tests.api.factories import make_api_key, make_job

pytestmark = pytest.mark.django_db

PARAMS = {"max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "top_k": 0, "min_p": 0.0,
          "repetition_penalty": 1.0, "seed": 5, "stop": ["SECRET STOP"]}


def _finished(api_key, **overrides) -> Job:
    fields = {"status": JobStatus.COMPLETED, "prompt": "my private prompt", "output_text": "my private answer",
              "messages": [{"role": "user", "content": "private"}], "params": PARAMS, "prompt_tokens": 10,
              "cached_tokens": 4, "completion_tokens": 16, "finish_reason": "length", "idempotency_key": "k-1",
              "request_fingerprint": "f" * 64, "started_at": timezone.now(), "finished_at": timezone.now(),
              **overrides}
    return make_job(api_key=api_key, **fields)


def test_deleting_a_finished_job_clears_its_content_and_the_job_is_not_found_afterwards(
    api_client, api_key, redis_client, broker, django_capture_on_commit_callbacks
):
    job = _finished(api_key)
    other = _finished(api_key, idempotency_key=None)
    redis_client.xadd(redis_keys.job_stream_key(str(job.id)), {"seq": "1", "text": "my private answer"})

    with django_capture_on_commit_callbacks(execute=True):
        response = api_client.delete(f"/api/v1/jobs/{job.id}")

    assert response.status_code == 200, response.content
    assert response.json() == {"id": str(job.id), "object": "job.deleted", "deleted": True}
    row = Job.objects.get(id=job.id)
    assert (row.prompt, row.output_text, row.messages, row.prompt_token_ids, row.error) == ("", "", None, [], None)
    assert "stop" not in row.params and row.params["temperature"] == 0.7 and row.params["seed"] == 5
    assert row.idempotency_key is None and row.request_fingerprint == "" and row.deleted_at is not None
    # What the quotas and the usage count stays, as does what happened.
    assert (row.status, row.prompt_tokens, row.cached_tokens, row.completion_tokens) == ("completed", 10, 4, 16)
    assert row.finished_at == job.finished_at
    assert redis_client.exists(redis_keys.job_stream_key(str(job.id))) == 0  # the stream held the same text
    # And once more later, after an output batch that may have been on its way.
    assert broker.messages == [(DROP_JOB_STREAM_TASK, [str(job.id)], {"countdown": 10})]

    assert api_client.get(f"/api/v1/jobs/{job.id}").status_code == 404
    assert [j["id"] for j in api_client.get("/api/v1/jobs").json()["results"]] == [str(other.id)]
    assert api_client.post(f"/api/v1/jobs/{job.id}/cancel").status_code == 404
    again = api_client.delete(f"/api/v1/jobs/{job.id}")
    assert again.status_code == 404 and again.json()["error"]["code"] == "job_not_found"


def test_the_later_drop_deletes_a_stream_that_a_late_output_batch_made_again(redis_client):
    from api.jobs.tasks import drop_job_stream

    assert drop_job_stream.name == DROP_JOB_STREAM_TASK in celery_app.tasks  # the name the delete sends
    redis_client.xadd(redis_keys.job_stream_key("j-1"), {"seq": "9", "text": "late"})

    drop_job_stream("j-1")  # a Celery task called in process runs at once

    assert redis_client.exists(redis_keys.job_stream_key("j-1")) == 0


def test_a_deleted_job_still_counts_towards_its_keys_tokens_of_the_day(api_client, api_key):
    api_key.tokens_per_day = 1000
    api_key.save()
    job = _finished(api_key)
    before = api_client.get("/api/v1/usage").json()["tokens_per_day"]
    assert before["used"] == 26

    assert api_client.delete(f"/api/v1/jobs/{job.id}").status_code == 200

    after = api_client.get("/api/v1/usage").json()["tokens_per_day"]
    assert (after["used"], after["remaining"]) == (26, 974)


def test_the_idempotency_key_of_a_deleted_job_names_a_new_job_afterwards(api_client):
    body = {"prompt": "hello", "max_tokens": 4}
    first = api_client.post("/api/v1/jobs", body, format="json", HTTP_IDEMPOTENCY_KEY="retry-1")
    assert first.status_code == 202
    Job.objects.filter(id=first.json()["id"]).update(status=JobStatus.COMPLETED, finished_at=timezone.now())
    assert api_client.delete(f"/api/v1/jobs/{first.json()['id']}").status_code == 200

    second = api_client.post("/api/v1/jobs", body, format="json", HTTP_IDEMPOTENCY_KEY="retry-1")

    assert second.status_code == 202 and second.json()["id"] != first.json()["id"]


@pytest.mark.parametrize("status", [JobStatus.QUEUED, JobStatus.IN_PROGRESS])
def test_a_queued_or_running_job_cannot_be_deleted(api_client, api_key, status):
    job = make_job(api_key=api_key, status=status, worker_id="w-1" if status == JobStatus.IN_PROGRESS else None)

    response = api_client.delete(f"/api/v1/jobs/{job.id}")

    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "job_not_finished" and "cancel it first" in error["message"]
    row = Job.objects.get(id=job.id)
    assert row.deleted_at is None and row.prompt == "Once upon a time" and row.status == status


def test_another_users_job_is_not_found_and_stays_as_it_was(api_client):
    other_key, _ = make_api_key()
    job = _finished(other_key)

    response = api_client.delete(f"/api/v1/jobs/{job.id}")

    assert response.status_code == 404 and response.json()["error"]["code"] == "job_not_found"
    row = Job.objects.get(id=job.id)
    assert row.deleted_at is None and row.output_text == "my private answer"


@pytest.mark.parametrize("job_id", ["00000000-0000-0000-0000-000000000000"])
def test_an_unknown_job_is_404_and_no_key_is_401(api_client, anon_client, job_id):
    assert api_client.delete(f"/api/v1/jobs/{job_id}").status_code == 404
    assert anon_client.delete(f"/api/v1/jobs/{job_id}").status_code == 401


def test_an_operator_cannot_requeue_a_deleted_job(api_client, api_key):
    job = _finished(api_key, status=JobStatus.CANCELLED)
    assert api_client.delete(f"/api/v1/jobs/{job.id}").status_code == 200

    with pytest.raises(JobNotRequeueable, match="deleted"):
        job_requeue(job_id=job.id)

    assert Job.objects.get(id=job.id).status == JobStatus.CANCELLED


def test_the_delete_is_in_the_schema(api_client):
    schema = api_client.get("/api/v1/schema").json()
    operation = schema["paths"]["/api/v1/jobs/{job_id}"]["delete"]
    assert operation["operationId"] == "jobs_destroy"
    assert {"200", "404", "409"} <= set(operation["responses"])


@pytest.mark.django_db(transaction=True)  # the consumer's DB calls run on other threads
@pytest.mark.usefixtures("consumer_connections_closed")
def test_a_deleted_jobs_websocket_is_refused_as_for_an_unknown_job(redis_client):
    api_key, secret = make_api_key()
    job = _finished(api_key)
    Job.objects.filter(id=job.id).update(deleted_at=timezone.now())

    async def scenario() -> tuple[dict, dict]:
        communicator = WebsocketCommunicator(application, f"/ws/v1/jobs/{job.id}/?api_key={secret}")
        await communicator.connect(timeout=10)
        message = await communicator.receive_json_from(timeout=10)
        closed = await communicator.receive_output(timeout=10)
        await communicator.disconnect()
        return message, closed

    message, closed = asyncio.run(scenario())

    assert message["type"] == "error" and message["error"]["code"] == "job_not_found"
    assert closed == {"type": "websocket.close", "code": 4404}
