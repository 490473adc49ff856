"""What the sockets and streams answer to hostile input and to a lost database, compared with
REST: the same error codes, and never a crash (a traceback and close 1011, or a 500). Through the
real ASGI application, Postgres and Redis."""

from __future__ import annotations

import asyncio
import json
import uuid
from unittest import mock

import pytest
from channels.testing import ApplicationCommunicator, WebsocketCommunicator
from django.db import InterfaceError, OperationalError
from rest_framework.test import APIClient

from api.common.redis_keys import job_stream_key
from api.models import Job, JobStatus
from api.streaming import messages
from engine_worker.protocol import OutputChunk
from inference_service.asgi import application
from tests.api.factories import make_api_key, make_job

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the consumers' DB calls run on other threads
    pytest.mark.usefixtures("consumer_connections_closed"),
]

NESTED = ["[" * 100_000 + "]" * 100_000, '{"a": ' * 100_000 + "1" + "}" * 100_000]


async def _messages_until_close(path: str, send: str | None = None, *, first: int = 0) -> tuple[list[dict], dict]:
    """Open ``path``, read ``first`` messages, send ``send``, then read up to the server's close."""
    communicator = WebsocketCommunicator(application, path)
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    received = [await communicator.receive_json_from(timeout=5) for _ in range(first)]
    if send is not None:
        await communicator.send_to(text_data=send)
    while True:
        output = await communicator.receive_output(timeout=10)
        if output["type"] == "websocket.close":
            await communicator.disconnect()
            return received, output
        received.append(json.loads(output["text"]))


def _http(path: str, *, secret: str, method: str = "GET", body: bytes = b"") -> tuple[int, bytes]:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"localhost"), (b"authorization", f"Bearer {secret}".encode()),
                         (b"content-type", b"application/json")],
             "client": ("127.0.0.1", 1), "server": ("localhost", 80)}

    async def run() -> tuple[int, bytes]:
        communicator = ApplicationCommunicator(application, scope)
        await communicator.send_input({"type": "http.request", "body": body, "more_body": False})
        start = await communicator.receive_output(timeout=10)
        content = b""
        while True:
            part = await communicator.receive_output(timeout=10)
            content += part.get("body", b"")
            if not part.get("more_body"):
                break
        await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait(timeout=10)
        return start["status"], content

    return asyncio.run(run())


@pytest.mark.parametrize("text", NESTED, ids=["brackets", "objects"])
def test_deeply_nested_json_on_a_generate_socket_is_4400_invalid_json(redis_client, dispatched, text):
    _, secret = make_api_key()

    received, closed = asyncio.run(_messages_until_close(f"/ws/v1/generate?api_key={secret}", text))

    assert [m["error"]["code"] for m in received] == ["invalid_json"]
    assert closed == {"type": "websocket.close", "code": 4400}
    assert not Job.objects.exists()


def test_a_bad_schema_on_a_generate_socket_is_an_error_naming_response_format_and_makes_no_job(redis_client, dispatched):
    _, secret = make_api_key()
    body = {"prompt": "x", "max_tokens": 4,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}}

    received, _ = asyncio.run(_messages_until_close(f"/ws/v1/generate?api_key={secret}", json.dumps(body)))

    assert [(m["error"]["code"], m["error"]["param"]) for m in received] == [("invalid_schema", "response_format")]
    assert not Job.objects.exists()


def test_deeply_nested_json_while_a_job_streams_is_a_notice_and_the_stream_goes_on(redis_client):
    api_key, secret = make_api_key()
    job_id = str(make_job(api_key=api_key, status=JobStatus.IN_PROGRESS, worker_id="w-1").id)
    redis_client.xadd(job_stream_key(job_id), messages.chunk_entry(OutputChunk(job_id=job_id, seq=1, text="a", completion_tokens=1)))

    async def scenario() -> tuple[dict, dict, bool]:
        communicator = WebsocketCommunicator(application, f"/ws/v1/jobs/{job_id}/?api_key={secret}")
        await communicator.connect(timeout=10)
        delta = await communicator.receive_json_from(timeout=5)
        await communicator.send_to(text_data=NESTED[0])
        notice = await communicator.receive_json_from(timeout=5)
        still_open = await communicator.receive_nothing(timeout=0.5)
        await communicator.disconnect()
        return delta, notice, still_open

    delta, notice, still_open = asyncio.run(scenario())

    assert delta["type"] == "delta"
    assert notice["type"] == "error" and notice["error"]["code"] == "invalid_message"
    assert still_open


def test_an_unknown_job_is_job_not_found_on_every_door(redis_client):
    _, secret = make_api_key()
    path = f"/api/v1/jobs/{uuid.uuid4()}"

    rest = APIClient().get(path, HTTP_AUTHORIZATION=f"Bearer {secret}")
    sse_status, sse_body = _http(f"{path}/events", secret=secret)
    received, closed = asyncio.run(_messages_until_close(f"/ws/v1/jobs/{uuid.uuid4()}/?api_key={secret}"))

    assert rest.status_code == sse_status == 404
    codes = {rest.json()["error"]["code"], json.loads(sse_body)["error"]["code"],
             received[0]["error"]["code"]}
    assert codes == {"job_not_found"}
    assert closed["code"] == 4404


@pytest.mark.parametrize("error", [OperationalError("terminating connection due to administrator command"),
                                   InterfaceError("connection already closed")], ids=["operational", "interface"])
def test_a_lost_database_connection_is_503_or_4503_with_the_envelope_on_every_door(redis_client, error):
    api_key, secret = make_api_key()
    job_id = str(make_job(api_key=api_key).id)
    body = b'{"model": "tiny", "prompt": "a", "max_tokens": 2}'

    with mock.patch("api.keys.authentication.api_key_with_owner", side_effect=error), \
            mock.patch("api.keys.authentication.api_key_with_owner_and_job", side_effect=error):
        rest = APIClient().get(f"/api/v1/jobs/{job_id}", HTTP_AUTHORIZATION=f"Bearer {secret}")
        sse = _http(f"/api/v1/jobs/{job_id}/events", secret=secret)
        openai = _http("/v1/completions", secret=secret, method="POST", body=body)
        job_socket = asyncio.run(_messages_until_close(f"/ws/v1/jobs/{job_id}/?api_key={secret}"))
        generate_socket = asyncio.run(_messages_until_close(f"/ws/v1/generate?api_key={secret}"))

    assert rest.status_code == 503 and rest.json()["error"]["code"] == "service_unavailable"
    assert rest["Retry-After"] == "1"
    for status, content in (sse, openai):
        assert status == 503
        assert json.loads(content)["error"]["type"] == "server_error"
    for received, closed in (job_socket, generate_socket):
        assert received[0]["error"]["code"] == "service_unavailable" and closed["code"] == 4503
