"""Jobs name a model: unknown ones are a 404, keys may be restricted to some (403), several
configured models need a name, and each job's message goes to its own model's queue."""

from __future__ import annotations

import asyncio

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from api.jobs.services import claim as job_claims
from api.jobs.tasks import reconcile_jobs
from api.models import ApiKey, Job, JobStatus
from tests.api.factories import heartbeat, make_api_key, make_job, publish_heartbeat
from tests.api.openai_api.client import request

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_models(settings, tiny_model_path):
    """Two configured models (one folder under two names: the web side only tokenizes)."""
    settings.MODELS = [("tiny", str(tiny_model_path)), ("tiny-b", str(tiny_model_path))]


def _restricted_key(models: list[str]) -> str:
    """A key an operator restricted to ``models`` (the admin's field); returns its secret."""
    key, secret = make_api_key()
    ApiKey.objects.filter(id=key.id).update(allowed_models=models)
    return secret


def _post(client, body):
    return client.post("/api/v1/jobs", body, format="json")


def test_an_unknown_model_is_a_404_model_not_found_in_the_envelope(api_client, dispatched):
    response = _post(api_client, {"model": "gpt-9", "prompt": "Hi", "max_tokens": 4})

    assert response.status_code == 404
    assert response.json() == {"error": {"message": "The model `gpt-9` does not exist.",
                                         "type": "invalid_request_error", "code": "model_not_found",
                                         "param": "model"}}
    assert dispatched == [] and not Job.objects.exists()


def test_with_one_model_a_job_without_a_model_runs_on_it(api_client, broker):
    response = _post(api_client, {"prompt": "Hi", "max_tokens": 4})

    assert response.status_code == 202
    assert response.json()["model"] == "tiny"
    assert Job.objects.get().model == "tiny"


def test_with_several_models_a_job_must_name_one_and_goes_to_that_models_queue(
        two_models, api_client, broker, django_capture_on_commit_callbacks):
    missing = _post(api_client, {"prompt": "Hi", "max_tokens": 4})
    assert missing.status_code == 400 and missing.json()["error"]["code"] == "model_required"

    with django_capture_on_commit_callbacks(execute=True):
        job_id = _post(api_client, {"model": "tiny-b", "prompt": "Hi", "max_tokens": 4}).json()["id"]

    assert Job.objects.get(id=job_id).model == "tiny-b"
    assert broker.messages[-1][1:] == ([job_id], {"queue": "engine.tiny-b"})


def test_a_key_restricted_to_other_models_is_refused_with_a_403(two_models, redis_client, dispatched):
    secret = _restricted_key(["tiny"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")

    refused = _post(client, {"model": "tiny-b", "prompt": "Hi", "max_tokens": 4})
    assert refused.status_code == 403
    assert refused.json()["error"] == {"message": "This API key may not use the model `tiny-b`.",
                                       "type": "invalid_request_error", "code": "model_not_allowed",
                                       "param": "model"}
    assert _post(client, {"model": "tiny", "prompt": "Hi", "max_tokens": 4}).status_code == 202
    assert list(Job.objects.values_list("model", flat=True)) == ["tiny"]


@pytest.mark.django_db(transaction=True)  # the OpenAI consumer's DB calls run on other threads
@pytest.mark.usefixtures("consumer_connections_closed")
def test_a_restricted_key_is_refused_on_the_openai_endpoints_too(two_models, redis_client, dispatched):
    secret = _restricted_key(["tiny"])

    response = asyncio.run(request("/v1/completions", {"model": "tiny-b", "prompt": "Hi"}, secret=secret))

    assert response.status == 403
    assert response.json()["error"]["code"] == "model_not_allowed" and dispatched == []


def test_a_model_without_a_live_worker_is_accepted_and_says_so(two_models, api_client, broker, redis_client):
    publish_heartbeat(redis_client, heartbeat(worker_id="w-a", model="tiny"))
    make_job(model="tiny")  # another model's queued job is not ahead of it

    response = _post(api_client, {"model": "tiny-b", "prompt": "Hi", "max_tokens": 4})

    assert response.status_code == 202
    assert response.json()["queue_position"] == 0 and response.json()["model_served"] is False
    detail = api_client.get(f"/api/v1/jobs/{response.json()['id']}").json()
    assert detail["model"] == "tiny-b" and detail["model_served"] is False
    served = _post(api_client, {"model": "tiny", "prompt": "Hi", "max_tokens": 4}).json()
    assert served["model_served"] is True and served["queue_position"] == 1
    health = api_client.get("/api/v1/health").json()["checks"]["workers"]
    assert health["models"] == {"tiny": {"live": 1, "served": True}, "tiny-b": {"live": 0, "served": False}}


def test_v1_models_lists_every_configured_model_with_its_workers_and_availability(two_models, api_client,
                                                                                 redis_client):
    publish_heartbeat(redis_client, heartbeat(worker_id="w-a", model="tiny", num_waiting=3))

    body = api_client.get("/v1/models").json()

    assert [(m["id"], m["object"], m["owned_by"], m["available"]) for m in body["data"]] == [
        ("tiny", "model", "mlx-inference-service", True), ("tiny-b", "model", "mlx-inference-service", False)]
    assert body["data"][0]["workers"][0]["worker_id"] == "w-a" and body["data"][0]["workers"][0]["load"] == 3
    assert api_client.get("/v1/models/tiny-b").json()["available"] is False
    missing = api_client.get("/v1/models/gpt-9")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_a_worker_claims_only_its_own_models_jobs(db):
    job = make_job(model="tiny-b")

    assert job_claims.job_claim(job_id=str(job.id), worker_id="w-a", lease_s=30, model="tiny") is None
    assert job_claims.job_queued_for_other_model(job_id=str(job.id), model="tiny")
    assert job_claims.job_claim(job_id=str(job.id), worker_id="w-b", lease_s=30, model="tiny-b") is not None


def test_the_reconciler_sends_a_job_routed_to_a_dead_worker_to_its_models_shared_queue(
        two_models, db, broker, monkeypatch):
    from api.jobs.services import reconciler

    monkeypatch.setattr(reconciler, "engine_queues_declare", lambda: None)
    job = make_job(model="tiny-b", routed_worker="w-dead", dispatch_count=1)
    Job.objects.filter(id=job.id).update(lease_expires_at=job.created_at)  # its claim deadline passed

    assert reconcile_jobs()["dispatched"] == 1

    assert broker.messages == [("api.tasks.run_job", [str(job.id)], {"queue": "engine.tiny-b"})]
    assert Job.objects.get(id=job.id).routed_worker is None


def test_a_chunk_with_log_probabilities_is_rendered_with_its_own_models_tokenizer(two_models, monkeypatch):
    from api.jobs import logprobs as job_logprobs
    from api.serving.catalog import model_path
    from api.streaming import messages
    from engine_worker.protocol import OutputChunk

    asked = []
    monkeypatch.setattr(job_logprobs, "model_path", lambda name: asked.append(name) or model_path(name))
    chunk = OutputChunk(job_id="j", seq=1, text="a", completion_tokens=1, logprobs=((5, -0.5, ((5, -0.5),)),))

    entry = messages.chunk_entry(chunk, model="tiny-b")
    message = messages.entry_to_message("j", entry)

    assert entry["model"] == "tiny-b" and asked == ["tiny-b"]
    assert message["logprobs"][0]["token_id"] == 5 and message["logprobs"][0]["logprob"] == -0.5
    plain = OutputChunk(job_id="j", seq=1, text="a", completion_tokens=1)
    assert "model" not in messages.chunk_entry(plain, model="tiny-b")


def test_model_served_says_the_same_in_the_202_and_in_get_once_the_job_has_left_the_queue(
        two_models, api_client, broker, redis_client):
    publish_heartbeat(redis_client, heartbeat(worker_id="w-a", model="tiny"))
    created = _post(api_client, {"model": "tiny", "prompt": "Hi", "max_tokens": 4}).json()
    Job.objects.filter(id=created["id"]).update(status=JobStatus.COMPLETED, finished_at=timezone.now())

    detail = api_client.get(f"/api/v1/jobs/{created['id']}").json()

    assert detail["status"] == "completed"
    assert created["model_served"] is detail["model_served"] is True
