"""Bad input gets a clear 4xx in the error envelope; nothing gets a 500."""

from __future__ import annotations

import json
import random

import pytest

from api.models import Job

pytestmark = pytest.mark.django_db


def post_raw(api_client, body: bytes | str, content_type: str = "application/json"):
    return api_client.generic("POST", "/api/v1/jobs", body, content_type=content_type)


def assert_error(response, status: int, *, param: str | None = None, code: str | None = None) -> dict:
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code", "param"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


def test_invalid_json_is_400_invalid_json(api_client):
    error = assert_error(post_raw(api_client, b'{"prompt": "hi",'), 400, code="invalid_json")
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("prompt", 123),
        ("prompt", ["a"]),
        ("max_tokens", "10"),
        ("max_tokens", 1.5),
        ("max_tokens", True),
        ("temperature", "hot"),
        ("seed", "x"),
        ("stop", 5),
        ("stop", ["ok", 3]),
        ("messages", "hello"),
        ("messages", [{"role": "user"}]),
        ("messages", [{"role": "robot", "content": "x"}]),
        ("messages", [{"role": "user", "content": 1}]),
        ("presence_penalty", "0.5"),
        ("presence_penalty", 2.01),
        ("frequency_penalty", -3),
        ("frequency_penalty", True),
        ("logit_bias", [1, 2]),
        ("logit_bias", {"-1": 5}),
        ("logit_bias", {"1.5": 5}),
        ("logit_bias", {"7": "5"}),
        ("logit_bias", {"7": -100.5}),
        ("logit_bias", {str(i): 1 for i in range(301)}),
    ],
)
def test_wrong_types_are_400_naming_the_field(api_client, field, value):
    body = {"prompt": "hi", "max_tokens": 4} if field != "prompt" and field != "messages" else {"max_tokens": 4}
    body[field] = value

    error = assert_error(api_client.post("/api/v1/jobs", body, format="json"), 400)

    assert error["param"].startswith(field)


def test_a_logit_bias_naming_a_token_the_model_does_not_have_is_400_and_makes_no_job(api_client):
    # The tiny model's vocabulary is 3,000 tokens (ids 0-2999).
    error = assert_error(api_client.post("/api/v1/jobs", {"prompt": "hi", "logit_bias": {"2999": 1, "3000": 1}},
                                         format="json"), 400)

    assert (error["code"], error["param"]) == ("invalid_token_id", "logit_bias")
    assert "3000" in error["message"] and "0 to 2999" in error["message"]
    assert not Job.objects.exists()


def test_body_that_is_not_an_object_is_400(api_client):
    assert_error(post_raw(api_client, b'["prompt"]'), 400)


@pytest.mark.parametrize("body", [{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, {}, {"max_tokens": 3}])
def test_both_or_neither_of_prompt_and_messages_is_400(api_client, body):
    assert_error(api_client.post("/api/v1/jobs", body, format="json"), 400, param="prompt", code="prompt_xor_messages")


@pytest.mark.parametrize("max_tokens", [0, -5])
def test_max_tokens_not_positive_is_400(api_client, max_tokens):
    assert_error(api_client.post("/api/v1/jobs", {"prompt": "a", "max_tokens": max_tokens}, format="json"),
                 400, param="max_tokens")


def test_max_tokens_over_the_service_cap_is_400(api_client, settings):
    settings.MAX_TOKENS_CAP = 64

    assert_error(api_client.post("/api/v1/jobs", {"prompt": "a", "max_tokens": 65}, format="json"),
                 400, param="max_tokens", code="max_tokens_too_large")


def test_max_tokens_over_the_keys_limit_is_400(api_client, api_key):
    api_key.max_tokens_per_job = 10
    api_key.save()

    error = assert_error(api_client.post("/api/v1/jobs", {"prompt": "a", "max_tokens": 11}, format="json"),
                         400, param="max_tokens", code="max_tokens_too_large")
    assert "10" in error["message"]


def test_negative_temperature_is_400(api_client):
    assert_error(api_client.post("/api/v1/jobs", {"prompt": "a", "temperature": -0.1}, format="json"),
                 400, param="temperature")


def test_prompt_longer_than_the_context_is_rejected_before_dispatch(api_client, dispatched):
    long_prompt = "word " * 5000  # > 4096 tokens of the tiny model

    error = assert_error(api_client.post("/api/v1/jobs", {"prompt": long_prompt, "max_tokens": 4}, format="json"),
                         400, param="prompt", code="context_length_exceeded")

    assert "4096" in error["message"]
    assert Job.objects.count() == 0 and dispatched == []


def test_prompt_longer_than_the_context_without_max_tokens_says_no_output_fits(api_client, dispatched):
    error = assert_error(api_client.post("/api/v1/jobs", {"prompt": "word " * 5000}, format="json"),
                         400, param="prompt", code="context_length_exceeded")

    # The request had no max_tokens: the message must not quote one the client never sent.
    assert "4096" in error["message"] and "no room for any output" in error["message"]
    assert "max_tokens" not in error["message"]
    assert Job.objects.count() == 0 and dispatched == []


def test_prompt_plus_max_tokens_over_the_context_is_rejected(api_client):
    messages = [{"role": "user", "content": "word " * 2000}]

    assert_error(api_client.post("/api/v1/jobs", {"messages": messages, "max_tokens": 4000}, format="json"),
                 400, param="messages", code="context_length_exceeded")


def test_unknown_field_is_400_naming_it(api_client):
    assert_error(api_client.post("/api/v1/jobs", {"prompt": "a", "max_token": 5}, format="json"),
                 400, param="max_token", code="unknown_field")


def test_unknown_field_inside_a_message_is_400(api_client):
    body = {"messages": [{"role": "user", "content": "a", "name": "x"}]}
    assert_error(api_client.post("/api/v1/jobs", body, format="json"), 400, code="unknown_field")


def test_wrong_content_type_is_415_in_the_envelope(api_client):
    assert_error(post_raw(api_client, "prompt=hi", content_type="application/x-www-form-urlencoded"), 415)


def test_unknown_api_url_is_404_in_the_envelope(api_client):
    assert_error(api_client.get("/api/v1/nothing-here"), 404, code="not_found")


def test_wrong_method_is_405_in_the_envelope(api_client):
    assert_error(api_client.delete("/api/v1/jobs"), 405, code="method_not_allowed")


def test_bad_idempotency_key_is_400(api_client):
    assert_error(api_client.post("/api/v1/jobs", {"prompt": "a"}, format="json", HTTP_IDEMPOTENCY_KEY="x" * 300),
                 400, param="Idempotency-Key")


BAD_VALUES = [None, True, False, 0, -1, 1, 2**70, -(2**70), 1e308, -1e308, 0.5, "", "x", "\x00", "\ud800",
              [], [None], ["\x00"], {}, {"a": 1}, "a" * 300, [{"role": "user", "content": "\x00"}]]
FIELDS = ["prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
          "seed", "stop", "priority", "extra"]
RAW_BODIES = [b"", b"null", b"1", b'"s"', b"[]", b"{", b'{"prompt": NaN}', b'{"prompt": "a", "temperature": NaN}',
              b'{"prompt": "a", "temperature": Infinity}', b'{"prompt": "a", "max_tokens": 1e400}',
              b"\xff\xfe", b'{"prompt": "\\ud800"}', b'{"prompt": "a\\u0000b"}', b'{"prompt": "a"' * 100,
              b"[" * 50_000, b'{"prompt": ' * 20_000, b'{"messages": [' + b'{"role": "user", "content": "x"},' * 2000 + b"]}"]


def test_deeply_nested_json_is_400_not_a_crash(api_client):
    assert_error(post_raw(api_client, b"[" * 100_000), 400, code="invalid_json")


def test_body_over_the_size_limit_is_413(api_client, settings):
    settings.MAX_REQUEST_BYTES = 10_000

    assert_error(post_raw(api_client, json.dumps({"prompt": "a" * 20_000})), 413, code="request_too_large")


def test_body_over_djangos_upload_limit_is_413(api_client, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 5_000

    assert_error(post_raw(api_client, json.dumps({"prompt": "a" * 6_000})), 413, code="request_too_large")


def test_prompt_over_the_character_limit_is_400(api_client, settings):
    settings.MAX_PROMPT_CHARS = 100

    assert_error(api_client.post("/api/v1/jobs", {"prompt": "a" * 101}, format="json"), 400, param="prompt")


def test_fuzzed_bad_bodies_never_produce_a_500(api_client, api_key):
    api_key.requests_per_minute = 10_000
    api_key.save()
    rng = random.Random(1234)
    bodies = [json.dumps({"prompt": "a", field: value}) for field in FIELDS for value in BAD_VALUES]
    bodies += [json.dumps({field: rng.choice(BAD_VALUES) for field in rng.sample(FIELDS, 4)}) for _ in range(150)]
    statuses = []
    for body in [b.encode("utf-8", "surrogatepass") for b in bodies] + RAW_BODIES:
        response = post_raw(api_client, body)
        statuses.append(response.status_code)
        assert response.status_code < 500, (body, response.content)
        if response.status_code >= 400:
            assert set(response.json()["error"]) == {"message", "type", "code", "param"}
    assert statuses.count(400) > len(statuses) // 2


def test_an_unexpected_error_is_a_500_in_the_envelope_not_an_html_page(api_client):
    from unittest import mock

    with mock.patch("api.jobs.views.job_list", side_effect=RuntimeError("bug")):
        response = api_client.get("/api/v1/jobs")

    assert_error(response, 500, code="internal_error")
    assert "bug" not in response.content.decode()
