"""The API answers what its OpenAPI schema says, checked on real responses.

Each response is validated against the schema that ``GET /api/v1/schema`` declares for its path,
method and status (OpenAPI 3.0's dialect, ``nullable`` included). Fuzzing the running service with
schemathesis found lists documented as bare arrays while they answer a page envelope, and status
codes the schema did not list; these tests keep them in step.
"""

from __future__ import annotations

from typing import Any

import pytest
from openapi_schema_validator import OAS30Validator
from rest_framework.test import APIClient

from tests.api.factories import heartbeat, make_job, publish_heartbeat

pytestmark = pytest.mark.django_db


@pytest.fixture
def schema() -> dict[str, Any]:
    return APIClient().get("/api/v1/schema").json()


def _declared(schema: dict[str, Any], path: str, method: str, status: int) -> dict[str, Any]:
    responses = schema["paths"][path][method]["responses"]
    assert str(status) in responses, f"{method.upper()} {path} answered {status}, which its schema does not list"
    body = responses[str(status)]["content"]["application/json"]["schema"]
    return {**body, "components": schema["components"]}  # "#/components/..." resolves from this root


def assert_conforms(schema: dict[str, Any], path: str, method: str, response) -> None:
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in OAS30Validator(_declared(schema, path, method, response.status_code)).iter_errors(response.json())]
    assert errors == []


def test_the_lists_answer_the_page_envelope_they_declare(schema, api_client, api_key):
    for _ in range(2):
        make_job(owner=api_key.owner, api_key=api_key)

    jobs = api_client.get("/api/v1/jobs?page_size=1")
    keys = api_client.get("/api/v1/keys?page_size=1")

    assert jobs.status_code == 200 and jobs.json()["count"] == 2 and jobs.json()["next"]
    assert_conforms(schema, "/api/v1/jobs", "get", jobs)
    assert keys.status_code == 200 and keys.json()["results"][0]["current"] is True
    assert_conforms(schema, "/api/v1/keys", "get", keys)


def test_a_page_past_the_last_is_a_documented_404(schema, api_client):
    for path in ("/api/v1/jobs", "/api/v1/keys"):
        response = api_client.get(f"{path}?page=99")
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
        assert_conforms(schema, path, "get", response)


def test_submission_job_usage_and_models_answer_their_schemas(schema, api_client, redis_client):
    publish_heartbeat(redis_client, heartbeat(worker_id="w-1", model="tiny"))

    created = api_client.post("/api/v1/jobs", {"prompt": "Once upon a time", "max_tokens": 4}, format="json")
    assert created.status_code == 202
    assert_conforms(schema, "/api/v1/jobs", "post", created)
    job = api_client.get(f"/api/v1/jobs/{created.json()['id']}")
    assert_conforms(schema, "/api/v1/jobs/{job_id}", "get", job)
    assert_conforms(schema, "/api/v1/usage", "get", api_client.get("/api/v1/usage"))
    models = api_client.get("/api/v1/models")
    assert models.status_code == 200 and models.json()["data"][0]["id"] == "tiny"
    assert_conforms(schema, "/api/v1/models", "get", models)


def test_models_without_a_key_is_a_documented_401_and_health_documents_its_503(schema, anon_client, redis_client):
    missing = anon_client.get("/api/v1/models")
    assert missing.status_code == 401
    assert_conforms(schema, "/api/v1/models", "get", missing)

    health = anon_client.get("/api/v1/health")  # no live worker here: 503, with the same body
    assert health.status_code == 503 and health.json()["checks"]["workers"]["live"] == 0
    assert_conforms(schema, "/api/v1/health", "get", health)


def test_the_job_body_schema_refuses_what_the_api_refuses(schema, api_client):
    """Exactly one of prompt and messages, no unknown field, and top_p above 0: rules the serializer
    checks in code."""
    body_schema = {**schema["components"]["schemas"]["JobCreateRequest"], "components": schema["components"]}
    validator = OAS30Validator(body_schema)
    messages = [{"role": "user", "content": "hi"}]

    for body, ok in (({"prompt": "hi"}, True), ({"messages": messages}, True), ({}, False),
                     ({"prompt": "hi", "messages": messages}, False), ({"prompt": "hi", "top_p": 0}, False),
                     ({"prompt": "hi", "top_p": 0.5}, True), ({"prompt": "hi", "tempreature": 0.5}, False)):
        assert validator.is_valid(body) is ok, body
        if not ok:
            assert api_client.post("/api/v1/jobs", body, format="json").status_code == 400, body


def test_the_openai_bodies_and_idempotency_keys_schemas_refuse_what_the_api_refuses(schema, api_client):
    """The API's side of these bodies is in tests/api/openai_api/test_validation.py (BAD)."""
    def validator(path: str) -> OAS30Validator:
        body = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        return OAS30Validator({**body, "components": schema["components"]})

    chat, text = validator("/v1/chat/completions"), validator("/v1/completions")
    messages = [{"role": "user", "content": "hi"}]
    assert chat.is_valid({"model": "tiny", "messages": messages, "stream": True,
                          "stream_options": {"include_usage": True}})
    assert not chat.is_valid({"model": "tiny", "messages": messages, "stream_options": {"x": 1}})
    assert not chat.is_valid({"model": "", "messages": messages})
    parts = [{"type": "text", "text": "hi"}]
    assert chat.is_valid({"model": "tiny", "messages": [{"role": "user", "content": parts}]})
    assert not chat.is_valid({"model": "tiny", "messages": [{"role": "user", "content": [{"image_url": "x"}]}]})
    assert text.is_valid({"model": "tiny", "prompt": ["Once"]})
    assert not text.is_valid({"model": "tiny", "prompt": []})

    for path, method in (("/api/v1/jobs", "post"), ("/v1/completions", "post"), ("/v1/chat/completions", "post")):
        [header] = [p for p in schema["paths"][path][method]["parameters"] if p["name"] == "Idempotency-Key"]
        key = OAS30Validator(header["schema"])
        assert key.is_valid("order-17 retry #2") and key.is_valid("x" * 255)
        assert not any(key.is_valid(bad) for bad in ("", "x" * 256, "caf\u00e9", "tab\there"))
    refused = api_client.post("/api/v1/jobs", {"prompt": "hi"}, format="json", HTTP_IDEMPOTENCY_KEY="tab\there")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_idempotency_key"
