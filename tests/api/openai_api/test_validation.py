"""The OpenAI-compatible endpoints refuse what they cannot serve with OpenAI's error envelope and a
4xx that names the parameter, and create no job for it; ``/v1/models`` lists the served model."""

from __future__ import annotations

import asyncio

import pytest

from api.models import Job
from tests.api.factories import make_api_key
from tests.api.openai_api.client import request

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the consumer's DB calls run on other threads
    pytest.mark.usefixtures("consumer_connections_closed", "redis_client", "dispatched"),
]

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
MESSAGES = [{"role": "user", "content": "hi"}]


def _chat(**fields):
    return {"model": "tiny", "messages": MESSAGES, **fields}


def _text(**fields):
    return {"model": "tiny", "prompt": "Once upon a time", **fields}


_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}

BAD = [
    # (path, body, status, code, param)
    (CHAT, b"{not json", 400, "invalid_json", None),
    (CHAT, b"[1, 2]", 400, "invalid_request", None),
    (CHAT, {"messages": MESSAGES}, 400, "required", "model"),
    (CHAT, _chat(model="gpt-4o"), 404, "model_not_found", "model"),
    (CHAT, {"model": "tiny"}, 400, "required", "messages"),
    (CHAT, _chat(messages=[]), 400, "min_length", "messages"),
    (CHAT, _chat(messages=[{"role": "function", "content": "x"}]), 400, "invalid_choice", "messages.0.role"),
    (CHAT, _chat(messages=[{"role": "tool", "content": "x"}]), 400, "invalid", "messages.0.tool_call_id"),
    (CHAT, _chat(messages=[{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}]), 400,
     "invalid", "messages.0.tool_calls"),
    (CHAT, _chat(messages=[{"role": "user", "content": None}]), 400, "null", "messages.0.content"),
    (CHAT, _chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
     400, "unsupported_content", "messages.0.content"),
    (CHAT, _chat(messages=[{"role": "user", "content": "hi", "name": "bob"}]), 400, "unknown_field",
     "messages.0.name"),
    (CHAT, _chat(n=2), 400, "unsupported_parameter", "n"),
    (CHAT, _chat(top_logprobs=2), 400, "invalid", "top_logprobs"),
    (CHAT, _chat(logprobs=True, top_logprobs=21), 400, "invalid", "top_logprobs"),
    (CHAT, _chat(logprobs="yes"), 400, "invalid", "logprobs"),
    (CHAT, _chat(tools=[{"type": "function", "function": {"name": "no spaces"}}]), 400, "invalid",
     "tools.0.function.name"),
    (CHAT, _chat(tools=[{"type": "function"}]), 400, "invalid", "tools.0"),
    (CHAT, _chat(tool_choice="auto"), 400, "invalid", "tool_choice"),
    (CHAT, _chat(tools=[_TOOL], tool_choice="always"), 400, "invalid", "tool_choice"),
    (CHAT, _chat(tools=[_TOOL], tool_choice={"type": "function", "function": {"name": "g"}}), 400, "invalid",
     "tool_choice"),
    (CHAT, _chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}]), 400,
     "invalid_schema", "tools"),
    (CHAT, _chat(tools=[_TOOL], parallel_tool_calls="yes"), 400, "invalid", "parallel_tool_calls"),
    (CHAT, _chat(response_format={"type": "xml"}), 400, "invalid", "response_format"),
    (CHAT, _chat(response_format={"type": "json_schema", "json_schema": {"schema": {}}}), 400, "invalid",
     "response_format"),
    (CHAT, _chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}),
     400, "invalid_schema", "response_format"),
    (TEXT, _text(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "propertyNames": {"maxLength": 3}}}}), 400, "invalid_schema",
     "response_format"),
    (CHAT, _chat(presence_penalty=2.5), 400, "max_value", "presence_penalty"),
    (CHAT, _chat(frequency_penalty="1"), 400, "invalid", "frequency_penalty"),
    (CHAT, _chat(logit_bias={"50256": -100}), 400, "invalid_token_id", "logit_bias"),  # the vocabulary is 3,000
    (TEXT, _text(logit_bias={"x1": 1}), 400, "invalid", "logit_bias"),
    (TEXT, _text(logit_bias={"1": 100.5}), 400, "invalid", "logit_bias"),
    (CHAT, _chat(metadata={"conversation": 7}), 400, "invalid", "metadata"),
    (CHAT, _chat(stream_options={"include_usage": True}), 400, "invalid", "stream_options"),
    (CHAT, _chat(stream=True, stream_options={"include_usage": "yes"}), 400, "invalid",
     "stream_options.include_usage"),
    (CHAT, _chat(stream="yes"), 400, "invalid", "stream"),
    (CHAT, _chat(functions=[]), 400, "unknown_field", "functions"),
    (CHAT, _chat(max_tokens=5, max_completion_tokens=5), 400, "invalid", "max_tokens"),
    (CHAT, _chat(max_completion_tokens=0), 400, "min_value", "max_completion_tokens"),
    (CHAT, _chat(max_completion_tokens=10**6), 400, "max_tokens_too_large", "max_completion_tokens"),
    (CHAT, _chat(max_tokens=0), 400, "min_value", "max_tokens"),
    (CHAT, _chat(temperature=-1), 400, "min_value", "temperature"),
    (CHAT, _chat(top_p="1"), 400, "invalid", "top_p"),
    (CHAT, _chat(stop=["a"] * 5), 400, "invalid", "stop"),
    (CHAT, _chat(messages=[{"role": "user", "content": "a " * 5000}], max_tokens=8), 400,
     "context_length_exceeded", "messages"),
    (TEXT, _text(prompt=["a", "b"]), 400, "unsupported_parameter", "prompt"),
    (TEXT, _text(prompt=[1, 2, 3]), 400, "unsupported_parameter", "prompt"),
    (TEXT, _text(prompt=[]), 400, "unsupported_parameter", "prompt"),
    (CHAT, _chat(stream=True, stream_options={"include_usage": True, "x": 1}), 400, "unknown_field",
     "stream_options.x"),
    (CHAT, _chat(model=""), 400, "blank", "model"),
    (TEXT, _text(prompt=""), 400, "blank", "prompt"),
    (TEXT, _text(suffix="x"), 400, "unsupported_parameter", "suffix"),
    (TEXT, _text(best_of=2), 400, "unsupported_parameter", "best_of"),
    (TEXT, _text(logprobs=1, echo=True), 400, "unsupported_parameter", "logprobs"),
    (TEXT, _text(logprobs=6), 400, "invalid", "logprobs"),
    (TEXT, _text(echo=1), 400, "invalid", "echo"),
    (TEXT, _text(messages=MESSAGES), 400, "unknown_field", "messages"),
]


@pytest.mark.parametrize(("path", "body", "status", "code", "param"), BAD,
                         ids=[f"{i}-{row[3]}-{row[4]}" for i, row in enumerate(BAD)])
def test_a_request_it_cannot_serve_is_a_4xx_in_the_envelope_naming_the_parameter_and_makes_no_job(
        path, body, status, code, param):
    _, secret = make_api_key()

    response = asyncio.run(request(path, body, secret=secret))

    assert response.status == status, response.body
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code", "param"} and error["message"]
    assert (error["code"], error["param"]) == (code, param), error
    assert error["type"] == "invalid_request_error"
    assert Job.objects.count() == 0


@pytest.mark.parametrize("path", [CHAT, TEXT])
def test_no_key_or_a_bad_one_is_a_401_before_the_body_is_read(path):
    missing = asyncio.run(request(path, b"{not json", secret=None))
    bad = asyncio.run(request(path, _chat(), secret="sk-not-a-key"))

    assert missing.status == 401 and missing.json()["error"]["code"] == "missing_api_key"
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert bad.status == 401 and bad.json()["error"]["code"] == "invalid_api_key"


def test_other_methods_media_types_and_oversized_bodies_are_refused(settings):
    _, secret = make_api_key()
    settings.MAX_REQUEST_BYTES = 2048

    get = asyncio.run(request(CHAT, b"", secret=secret, method="GET"))
    text_plain = asyncio.run(request(CHAT, _chat(), secret=secret, headers=[(b"content-type", b"text/plain")]))
    too_large = asyncio.run(request(CHAT, _chat(user="x" * 4096), secret=secret))

    assert get.status == 405 and get.headers["allow"] == "POST"
    assert get.json()["error"]["code"] == "method_not_allowed"
    assert text_plain.status == 415 and text_plain.json()["error"]["code"] == "unsupported_media_type"
    assert too_large.status == 413 and too_large.json()["error"]["code"] == "request_too_large"
    assert Job.objects.count() == 0


def test_models_lists_the_served_model_in_openais_shape(api_client):
    listed = api_client.get("/v1/models")
    one = api_client.get("/v1/models/tiny")
    other = api_client.get("/v1/models/gpt-4o")

    assert listed.status_code == 200
    assert listed.json()["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in listed.json()["data"]] == [
        ("tiny", "model", "mlx-inference-service")]
    assert one.status_code == 200 and one.json()["id"] == "tiny" and isinstance(one.json()["created"], int)
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"


def test_models_needs_a_key_and_unknown_v1_paths_get_the_envelope(client):
    unauthenticated = client.get("/v1/models")
    unknown = client.get("/v1/embeddings")

    assert unauthenticated.status_code == 401 and unauthenticated.json()["error"]["code"] == "missing_api_key"
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"


def test_the_schema_has_the_openai_paths(db):
    from rest_framework.test import APIClient

    paths = APIClient().get("/api/v1/schema").json()["paths"]

    chat = paths["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["required"] == ["model", "messages"]
    assert set(chat["responses"]) >= {"200", "400", "401", "404", "429"}
    assert "prompt" in paths["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"][
        "properties"]
    assert "get" in paths["/v1/models"] and "get" in paths["/v1/models/{model_id}"]
