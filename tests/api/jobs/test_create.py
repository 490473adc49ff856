from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from api.jobs.services.dispatch import RUN_JOB_TASK
from api.jobs.services.lifecycle import jobs_needing_dispatch
from api.jobs.tasks import run_job
from api.models import Job, JobStatus
from api.serving.tokenization import get_tokenizer
from inference_service.celery import app
from tests.api.factories import make_api_key, make_job

pytestmark = pytest.mark.django_db


def test_post_prompt_returns_202_with_id_status_and_queue_position(api_client):
    response = api_client.post("/api/v1/jobs", {"prompt": "Hello there", "max_tokens": 8}, format="json")

    assert response.status_code == 202
    body = response.json()
    job = Job.objects.get(id=body["id"])
    assert body["status"] == "queued" == job.status
    assert body["queue_position"] == 0
    assert job.prompt_token_ids == get_tokenizer().encode_prompt("Hello there")
    assert job.params["max_tokens"] == 8


def test_the_prompts_token_count_is_in_the_jobs_usage_from_its_submission(api_client):
    body = api_client.post("/api/v1/jobs", {"prompt": "Hello there", "max_tokens": 8}, format="json").json()
    prompt_tokens = len(get_tokenizer().encode_prompt("Hello there"))

    assert api_client.get(f"/api/v1/jobs/{body['id']}").json()["usage"]["prompt_tokens"] == prompt_tokens
    Job.objects.filter(id=body["id"]).update(status=JobStatus.IN_PROGRESS)  # claimed: no final yet
    usage = api_client.get(f"/api/v1/jobs/{body['id']}").json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (prompt_tokens, 0,
                                                                                          prompt_tokens)


def test_queue_position_counts_queued_jobs_ahead_in_priority_then_arrival_order(api_client, api_key):
    make_job(api_key=api_key, priority=api_key.priority)
    make_job(api_key=api_key, priority=api_key.priority, status=JobStatus.IN_PROGRESS)

    response = api_client.post("/api/v1/jobs", {"prompt": "x", "max_tokens": 4}, format="json")

    assert response.json()["queue_position"] == 1


def test_queue_position_counts_only_queued_jobs_that_are_more_urgent_or_queued_earlier(api_client, api_key):
    now = timezone.now()
    make_job(api_key=api_key, priority=api_key.priority - 5, queued_at=now + dt.timedelta(seconds=5))  # more urgent
    make_job(api_key=api_key, priority=api_key.priority, queued_at=now - dt.timedelta(seconds=5))  # earlier
    make_job(api_key=api_key, priority=api_key.priority, queued_at=now - dt.timedelta(seconds=5),
             status=JobStatus.IN_PROGRESS)  # not queued any more
    make_job(api_key=api_key, priority=api_key.priority + 10, queued_at=now - dt.timedelta(seconds=5))  # less urgent

    response = api_client.post("/api/v1/jobs", {"prompt": "x", "max_tokens": 4}, format="json")

    assert response.json()["queue_position"] == 2
    assert api_client.get(f"/api/v1/jobs/{response.json()['id']}").json()["queue_position"] == 2


def test_messages_are_rendered_with_the_chat_template_with_a_single_bos(api_client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]

    response = api_client.post("/api/v1/jobs", {"messages": messages, "max_tokens": 4}, format="json")

    job = Job.objects.get(id=response.json()["id"])
    tokenizer = get_tokenizer()
    assert job.prompt_token_ids == tokenizer.encode_messages(messages)
    bos = tokenizer._tokenizer.bos_token_id
    assert job.prompt_token_ids[0] == bos and job.prompt_token_ids.count(bos) == 1
    assert job.messages == messages and job.prompt == ""


def test_job_is_dispatched_to_celery_with_its_id_only_after_commit(
    api_client, dispatched, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = api_client.post("/api/v1/jobs", {"prompt": "Hi", "max_tokens": 4}, format="json")
        assert dispatched == []  # nothing sent while the transaction is open

    for callback in callbacks:
        callback()
    job_id = response.json()["id"]
    assert dispatched == [job_id]
    assert Job.objects.get(id=job_id).dispatch_count == 1


def test_each_job_is_one_run_job_message_with_its_id_on_its_models_queue(
    api_client, broker, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        ids = [api_client.post("/api/v1/jobs", {"prompt": f"Hi {i}", "max_tokens": 4}, format="json").json()["id"]
               for i in range(3)]

    assert broker.messages == [(RUN_JOB_TASK, [job_id], {"queue": "engine.tiny"}) for job_id in ids]
    # Sent by name: the name is the engine workers' task; a message without a queue (an older web
    # process's) goes to the old shared queue, which every worker still consumes.
    assert run_job.name == RUN_JOB_TASK and RUN_JOB_TASK in app.tasks
    assert app.amqp.router.route({}, RUN_JOB_TASK)["queue"].name == "engine"


def test_broker_outage_at_dispatch_keeps_the_job_queued_for_the_reconciler(
    api_client, broker, django_capture_on_commit_callbacks
):
    broker.down = ConnectionError("broker down")
    with django_capture_on_commit_callbacks(execute=True):
        response = api_client.post("/api/v1/jobs", {"prompt": "Hi", "max_tokens": 4}, format="json")

    assert response.status_code == 202
    job = Job.objects.get(id=response.json()["id"])
    assert job.status == JobStatus.QUEUED and job.dispatch_count == 0  # not counted as sent
    assert jobs_needing_dispatch(queued_grace_s=0) == [str(job.id)]


def test_same_idempotency_key_and_body_returns_the_same_job(api_client, dispatched, django_capture_on_commit_callbacks):
    body = {"prompt": "Hi", "max_tokens": 4, "stop": "\n"}
    with django_capture_on_commit_callbacks(execute=True):
        first = api_client.post("/api/v1/jobs", body, format="json", HTTP_IDEMPOTENCY_KEY="abc-1")
        second = api_client.post("/api/v1/jobs", body, format="json", HTTP_IDEMPOTENCY_KEY="abc-1")

    assert first.status_code == 202 and second.status_code == 200
    assert first.json()["id"] == second.json()["id"]
    assert Job.objects.count() == 1
    assert dispatched == [first.json()["id"]]


def test_same_idempotency_key_with_another_body_is_422(api_client):
    api_client.post("/api/v1/jobs", {"prompt": "Hi", "max_tokens": 4}, format="json", HTTP_IDEMPOTENCY_KEY="k")

    response = api_client.post("/api/v1/jobs", {"prompt": "Bye", "max_tokens": 4}, format="json",
                               HTTP_IDEMPOTENCY_KEY="k")

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "idempotency_key_reused"
    assert Job.objects.count() == 1


@pytest.mark.parametrize("key", ["", "k" * 256, "tab\there", "caf\u00e9", "\u00d0\u00ba\u00d0\u00bb"])
def test_an_idempotency_key_that_is_empty_too_long_or_not_printable_ascii_is_400(api_client, key):
    # "\u00d0\u00ba\u00d0\u00bb" is UTF-8 "кл" as Django sees it (header bytes decoded as Latin-1).
    response = api_client.post("/api/v1/jobs", {"prompt": "Hi", "max_tokens": 4}, format="json",
                               HTTP_IDEMPOTENCY_KEY=key)

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_idempotency_key"
    assert response.json()["error"]["param"] == "Idempotency-Key"
    assert Job.objects.count() == 0


def test_an_idempotency_key_of_255_printable_ascii_characters_is_accepted(api_client):
    key = "~ Az-09_." * 28 + "xyz"

    response = api_client.post("/api/v1/jobs", {"prompt": "Hi", "max_tokens": 4}, format="json",
                               HTTP_IDEMPOTENCY_KEY=key)

    assert len(key) == 255 and response.status_code == 202
    assert Job.objects.get().idempotency_key == key


def test_idempotency_keys_are_scoped_per_user(api_client):
    api_client.post("/api/v1/jobs", {"prompt": "Hi", "max_tokens": 4}, format="json", HTTP_IDEMPOTENCY_KEY="k")
    _, other_secret = make_api_key()
    api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {other_secret}")

    response = api_client.post("/api/v1/jobs", {"prompt": "Other", "max_tokens": 4}, format="json",
                               HTTP_IDEMPOTENCY_KEY="k")

    assert response.status_code == 202
    assert Job.objects.count() == 2


def test_request_priority_cannot_be_more_urgent_than_the_keys_class(api_client, api_key):
    api_key.priority = 5
    api_key.save()

    urgent = api_client.post("/api/v1/jobs", {"prompt": "a", "max_tokens": 2, "priority": 0}, format="json")
    relaxed = api_client.post("/api/v1/jobs", {"prompt": "a", "max_tokens": 2, "priority": 9}, format="json")

    assert Job.objects.get(id=urgent.json()["id"]).priority == 5
    assert Job.objects.get(id=relaxed.json()["id"]).priority == 9


def test_sampling_parameters_are_stored_and_stop_string_becomes_a_list(api_client):
    body = {"prompt": "a", "max_tokens": 3, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
            "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.25,
            "logit_bias": {"17": 5, "0042": -100}, "logprobs": 2, "seed": 42, "stop": "END"}

    response = api_client.post("/api/v1/jobs", body, format="json")

    params = Job.objects.get(id=response.json()["id"]).params
    assert params == {"max_tokens": 3, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
                      "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.25,
                      "logit_bias": {"17": 5.0, "42": -100.0}, "logprobs": 2, "seed": 42, "stop": ["END"]}


def test_sampling_parameters_left_out_are_stored_as_their_defaults(api_client):
    response = api_client.post("/api/v1/jobs", {"prompt": "a", "max_tokens": 3}, format="json")

    params = Job.objects.get(id=response.json()["id"]).params
    assert params == {"max_tokens": 3, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                      "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                      "logit_bias": {}, "logprobs": None, "seed": None, "stop": []}


def test_max_tokens_defaults_within_the_context_left_by_the_prompt(api_client, settings):
    settings.DEFAULT_MAX_TOKENS = 100_000
    settings.MAX_TOKENS_CAP = 100_000

    response = api_client.post("/api/v1/jobs", {"prompt": "word " * 50}, format="json")

    job = Job.objects.get(id=response.json()["id"])
    assert len(job.prompt_token_ids) + job.params["max_tokens"] == get_tokenizer().info.context_length
