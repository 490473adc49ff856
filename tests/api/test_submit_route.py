"""POST /api/v1/jobs in one hop (api/submit_route.py): what it answers is what Django and DRF
answer, request by request; whatever it does not mirror goes to Django."""

from __future__ import annotations

import asyncio
import json
import logging
from unittest import mock

import pytest
from django.test import override_settings

from api.models import Job
from api.services.api_keys import api_key_revoke
from api.submit_route import SubmitRoute
from inference_service.asgi import django_http, http_app
from tests.api.factories import make_api_key

pytestmark = pytest.mark.django_db(transaction=True)  # the requests run on the request threads

PROMPT = {"prompt": "Once upon a time", "max_tokens": 8}


class Recorder:
    """The app behind the route, recording whether a request reached it."""

    def __init__(self, app) -> None:
        self.app = app
        self.calls = 0

    async def __call__(self, scope, receive, send) -> None:
        self.calls += 1
        await self.app(scope, receive, send)


@pytest.fixture
def route(redis_client, dispatched):
    """The application's route, with a recorder in front of the Django app behind it."""
    behind = Recorder(http_app.app)
    with mock.patch.object(http_app, "app", behind):
        yield http_app, behind


@pytest.fixture
def secret(user):
    return make_api_key(owner=user)[1]


def post(app, body: bytes | dict | str, *, headers: dict[str, str] | None = None, query: bytes = b"",
         chunks: int = 1, disconnect: bool = False) -> dict:
    """POST ``body`` to ``/api/v1/jobs`` through the ASGI ``app``: {"status", "headers", "body"}
    (headers by lower-case name), or None if nothing was sent."""
    if isinstance(body, dict):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    fields = {"host": "127.0.0.1:8000", "content-type": "application/json", "content-length": str(len(body)),
              **(headers or {})}
    raw_headers = [(name.encode(), value.encode("latin-1")) for name, value in fields.items() if value is not None]
    scope = {"type": "http", "http_version": "1.1", "method": "POST", "scheme": "http", "path": "/api/v1/jobs",
             "raw_path": b"/api/v1/jobs", "query_string": query, "root_path": "", "headers": raw_headers,
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000)}
    size = max(1, -(-len(body) // chunks))
    parts = [body[i:i + size] for i in range(0, len(body), size)] or [b""]
    inbox = [{"type": "http.request", "body": part, "more_body": i < len(parts) - 1} for i, part in enumerate(parts)]
    if disconnect:
        inbox = inbox[:1] if len(inbox) > 1 else []
    sent: list[dict] = []

    async def receive():
        return inbox.pop(0) if inbox else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(asyncio.wait_for(app(scope, receive, send), timeout=10))
    if not sent:
        return None
    start = sent[0]
    return {"status": start["status"],
            "headers": {name.decode().lower(): value.decode() for name, value in start["headers"]},
            "body": b"".join(m.get("body", b"") for m in sent[1:])}


def auth(secret: str, **more: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}", **more}


ERROR_BODIES = [
    pytest.param(b'{"prompt": "hi",', id="invalid-json"),
    pytest.param(b"[1, 2]", id="not-an-object"),
    pytest.param(b"", id="empty-body"),
    pytest.param(b'{"prompt": NaN}', id="nan"),
    pytest.param(b"\xff\xfe", id="invalid-utf8"),
    pytest.param({"prompt": 123}, id="wrong-type"),
    pytest.param({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, id="both"),
    pytest.param({"max_tokens": 4}, id="neither"),
    pytest.param({"prompt": "a", "max_tokens": 0}, id="max-tokens-zero"),
    pytest.param({"prompt": "a", "max_tokens": 10**6}, id="max-tokens-over-cap"),
    pytest.param({"prompt": "a", "temperature": -1}, id="negative-temperature"),
    pytest.param({"prompt": "a", "max_token": 4}, id="unknown-field"),
    pytest.param({"prompt": "word " * 5000, "max_tokens": 8}, id="longer-than-context"),
    pytest.param({"messages": [{"role": "robot", "content": "x"}]}, id="bad-message"),
]


@pytest.mark.parametrize("body", ERROR_BODIES)
def test_an_invalid_submission_gets_djangos_answer_from_the_route(route, secret, body):
    app, behind = route
    answer = post(app, body, headers=auth(secret))
    assert behind.calls == 0  # the route answered it
    assert answer == post(django_http, body, headers=auth(secret))
    assert 400 <= answer["status"] < 500
    assert set(json.loads(answer["body"])["error"]) == {"message", "type", "code", "param"}
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({"authorization": "Bearer sk-not-a-key"}, id="unknown-key"),
        pytest.param({"authorization": "Basic dXNlcjpwdw=="}, id="malformed"),
        pytest.param({"authorization": "Bearer sk-x", "idempotency-key": "x" * 300}, id="bad-key-first"),
    ],
)
def test_a_bad_key_gets_the_same_401_from_the_route(route, headers):
    app, behind = route
    answer = post(app, PROMPT, headers=headers)
    assert behind.calls == 0
    assert answer["status"] == 401
    assert answer["headers"]["www-authenticate"] == 'Bearer realm="api"'
    assert answer == post(django_http, PROMPT, headers=headers)


def test_a_revoked_key_gets_the_same_401_from_the_route(route, user):
    api_key, secret = make_api_key(owner=user)
    api_key_revoke(api_key_id=api_key.id)
    app, _ = route
    answer = post(app, PROMPT, headers=auth(secret))
    assert json.loads(answer["body"])["error"]["code"] == "revoked_api_key"
    assert answer == post(django_http, PROMPT, headers=auth(secret))


def test_a_submission_through_the_route_is_queued_and_dispatched_as_through_django(route, secret, dispatched):
    app, behind = route
    ours = post(app, PROMPT, headers=auth(secret))
    theirs = post(django_http, PROMPT, headers=auth(secret))
    assert behind.calls == 0
    assert ours["status"] == theirs["status"] == 202
    assert set(ours["headers"]) == set(theirs["headers"])
    for name in ("content-type", "allow", "x-frame-options", "x-content-type-options", "referrer-policy",
                 "cross-origin-opener-policy", "x-ratelimit-limit"):
        assert ours["headers"][name] == theirs["headers"][name]
    assert int(ours["headers"]["content-length"]) == len(ours["body"])
    body = json.loads(ours["body"])
    assert set(body) == set(json.loads(theirs["body"])) == {"id", "object", "status", "queue_position", "created_at"}
    assert ours["headers"]["location"] == f"/api/v1/jobs/{body['id']}"
    assert (body["status"], body["queue_position"]) == ("queued", 0)
    assert json.loads(theirs["body"])["queue_position"] == 1
    job = Job.objects.get(id=body["id"])
    assert (job.prompt, job.params["max_tokens"]) == ("Once upon a time", 8)
    assert dispatched == [body["id"], json.loads(theirs["body"])["id"]]


def test_an_idempotent_retry_through_the_route_returns_the_first_job(route, secret):
    app, _ = route
    headers = auth(secret, **{"idempotency-key": "retry-1"})
    first = post(app, PROMPT, headers=headers)
    again = post(app, PROMPT, headers=headers)
    via_django = post(django_http, PROMPT, headers=headers)
    assert (first["status"], again["status"], via_django["status"]) == (202, 200, 200)
    assert json.loads(again["body"]) == json.loads(via_django["body"])
    assert json.loads(again["body"])["id"] == json.loads(first["body"])["id"]
    reused = post(app, {**PROMPT, "max_tokens": 9}, headers=headers)
    assert reused == post(django_http, {**PROMPT, "max_tokens": 9}, headers=headers)
    assert reused["status"] == 422
    assert Job.objects.count() == 1


def test_a_used_up_quota_gets_the_same_429_from_the_route(route, user):
    _, secret = make_api_key(owner=user, max_concurrent_jobs=1)
    app, _ = route
    assert post(app, PROMPT, headers=auth(secret))["status"] == 202
    ours = post(app, PROMPT, headers=auth(secret))
    theirs = post(django_http, PROMPT, headers=auth(secret))
    assert ours["status"] == theirs["status"] == 429
    assert ours["body"] == theirs["body"]
    assert set(ours["headers"]) == set(theirs["headers"]) >= {"retry-after", "x-ratelimit-remaining"}
    assert Job.objects.count() == 1


def test_an_unexpected_error_is_the_same_500_envelope(route, secret):
    app, _ = route
    with mock.patch("api.views.jobs.job_create", side_effect=RuntimeError("boom")):
        ours = post(app, PROMPT, headers=auth(secret))
        theirs = post(django_http, PROMPT, headers=auth(secret))
    assert ours["status"] == 500
    assert ours == theirs
    assert json.loads(ours["body"])["error"]["code"] == "internal_error"


def test_the_route_logs_a_rejected_submission_as_django_does(route, secret, caplog):
    app, _ = route
    with caplog.at_level(logging.WARNING, logger="django.request"):
        post(app, {"prompt": "a", "max_tokens": 0}, headers=auth(secret))
    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "django.request"] == [
        (logging.WARNING, "Bad Request: /api/v1/jobs")
    ]


def test_a_body_in_several_messages_is_read_whole(route, secret):
    app, behind = route
    answer = post(app, {"prompt": "Once upon a time " * 100, "max_tokens": 4}, headers=auth(secret), chunks=4)
    assert behind.calls == 0
    assert answer["status"] == 202


@pytest.mark.parametrize(
    ("extra", "query", "status"),
    [
        pytest.param({"authorization": None}, b"", 401, id="no-key"),
        pytest.param({"content-type": "text/plain"}, b"", 415, id="other-media-type"),
        pytest.param({"content-type": "application/json; charset=latin-1"}, b"", 202, id="other-charset"),
        pytest.param({"accept": "text/html"}, b"", 406, id="not-acceptable"),
        pytest.param({"accept": "application/json; indent=2"}, b"", 202, id="indented"),
        pytest.param({}, b"format=xml", 404, id="format-override"),
        pytest.param({"cookie": "sessionid=abc"}, b"", 202, id="cookie"),
        pytest.param({"host": "evil.example"}, b"", 400, id="disallowed-host"),
        pytest.param({"content-length": None}, b"", 400, id="no-content-length"),
    ],
)
def test_what_the_route_does_not_mirror_goes_to_django(route, secret, extra, query, status):
    app, behind = route
    headers = {**auth(secret), **extra}
    answer = post(app, PROMPT, headers=headers, query=query)
    assert behind.calls == 1
    assert answer["status"] == status


@override_settings(MAX_REQUEST_BYTES=1024)
def test_a_body_over_the_limit_is_replayed_to_django_which_answers_413(route, secret):
    app, behind = route
    body = {"prompt": "x" * 3000}
    answer = post(app, body, headers=auth(secret), chunks=5)
    assert behind.calls == 1
    assert answer["status"] == 413
    assert answer == post(django_http, body, headers=auth(secret), chunks=5)
    # Django reads the key before the body: an unknown key is still a 401.
    assert post(app, body, headers=auth("sk-unknown"), chunks=5)["status"] == 401


def test_a_client_that_leaves_before_its_body_arrives_gets_nothing(route, secret):
    app, behind = route
    assert post(app, {"prompt": "x" * 100}, headers=auth(secret), chunks=3, disconnect=True) is None
    assert behind.calls == 0
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "changed",
    [
        {"MIDDLEWARE": ["django.middleware.common.CommonMiddleware"]},
        {"SECURE_SSL_REDIRECT": True},
        {"SECURE_HSTS_SECONDS": 3600},
        {"DISALLOWED_USER_AGENTS": ["curl"]},
    ],
)
def test_with_settings_it_does_not_mirror_the_route_leaves_every_submission_to_django(redis_client, dispatched,
                                                                                   secret, changed):
    with override_settings(**changed):
        behind = Recorder(django_http)
        route = SubmitRoute(behind, executor=django_http.executor)
        assert not route.enabled
        post(route, PROMPT, headers=auth(secret))
    assert behind.calls == 1


def test_the_route_is_on_with_the_projects_settings():
    assert http_app.enabled
