"""A key revoked while its sockets and streams are open: every submission and cancel reads the key
again, and the revocation ends the job streams the key opened, at once (api/keys/revocation.py).
Through the real ASGI application, Postgres, Redis and the channel layer."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.db import database_sync_to_async
from channels.testing import ApplicationCommunicator, WebsocketCommunicator
from django.test import Client
from django.utils import timezone

from api.common.redis_keys import job_stream_key
from api.keys.admin import QUOTA_FIELDS
from api.keys.services import api_key_revoke
from api.models import ApiKey, Job, JobStatus
from api.streaming import messages
from engine_worker.protocol import OutputChunk
from inference_service.asgi import application
from tests.api.factories import make_api_key, make_job, make_user

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the consumers' DB calls run on other threads
    pytest.mark.usefixtures("consumer_connections_closed"),
]


async def _open(path: str) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, path)
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    return communicator


async def _error_and_close(communicator: WebsocketCommunicator) -> tuple[dict, dict]:
    message = await communicator.receive_json_from(timeout=5)
    closed = await communicator.receive_output(timeout=5)
    await communicator.disconnect()  # the client's side of the close, as daphne reports it
    return message, closed


@database_sync_to_async
def _revoke_row_only(api_key_id: int) -> None:
    """The row revoked and nothing announced (as an operator's edit of ``revoked_at`` in the
    admin does): what a submission or a cancel must see by reading the key again."""
    ApiKey.objects.filter(id=api_key_id).update(revoked_at=timezone.now())


def _streaming_job(redis_client, api_key: ApiKey) -> str:
    """A running job with one chunk in its stream: a socket that got the chunk has connected."""
    job_id = str(make_job(api_key=api_key, status=JobStatus.IN_PROGRESS, worker_id="w-1").id)
    chunk = OutputChunk(job_id=job_id, seq=1, text="Once", completion_tokens=1)
    redis_client.xadd(job_stream_key(job_id), messages.chunk_entry(chunk))
    return job_id


def test_a_generate_socket_whose_key_was_revoked_after_it_opened_cannot_submit(redis_client, dispatched):
    api_key, secret = make_api_key()

    async def scenario() -> tuple[dict, dict]:
        communicator = await _open(f"/ws/v1/generate?api_key={secret}")
        await _revoke_row_only(api_key.id)
        await communicator.send_json_to({"prompt": "Once upon a time", "max_tokens": 4})
        return await _error_and_close(communicator)

    message, closed = asyncio.run(scenario())

    assert message["type"] == "error" and message["error"]["code"] == "revoked_api_key"
    assert closed == {"type": "websocket.close", "code": 4401}
    assert not Job.objects.exists() and dispatched == []


def test_a_cancel_on_a_socket_whose_key_was_revoked_is_refused_and_ends_the_socket(redis_client):
    api_key, secret = make_api_key()
    job_id = _streaming_job(redis_client, api_key)

    async def scenario() -> tuple[dict, dict, dict]:
        communicator = await _open(f"/ws/v1/jobs/{job_id}/?api_key={secret}")
        delta = await communicator.receive_json_from(timeout=5)
        await _revoke_row_only(api_key.id)
        await communicator.send_json_to({"type": "cancel"})
        return delta, *await _error_and_close(communicator)

    delta, message, closed = asyncio.run(scenario())

    assert delta["type"] == "delta"
    assert message["error"]["code"] == "revoked_api_key" and closed["code"] == 4401
    assert Job.objects.get(id=job_id).cancel_requested is False


def test_revoking_a_key_ends_the_sockets_it_opened_with_4401_and_leaves_the_owners_other_keys_alone(redis_client):
    api_key, secret = make_api_key()
    _, other_secret = make_api_key(owner=api_key.owner)
    job_id = _streaming_job(redis_client, api_key)

    async def scenario() -> tuple[list, bool]:
        following = await _open(f"/ws/v1/jobs/{job_id}/?api_key={secret}")
        kept = await _open(f"/ws/v1/jobs/{job_id}/?api_key={other_secret}")
        for communicator in (following, kept):
            assert (await communicator.receive_json_from(timeout=5))["type"] == "delta"
        idle_generate = await _open(f"/ws/v1/generate?api_key={secret}")
        await asyncio.sleep(0.5)  # its connect (authentication) is done

        await database_sync_to_async(api_key_revoke)(api_key_id=api_key.id)

        ended = [await _error_and_close(following), await _error_and_close(idle_generate)]
        kept_quiet = await kept.receive_nothing(timeout=1)
        await kept.disconnect()
        return ended, kept_quiet

    ended, kept_quiet = asyncio.run(scenario())

    for message, closed in ended:
        assert message["type"] == "error" and message["error"]["code"] == "revoked_api_key"
        assert closed == {"type": "websocket.close", "code": 4401}
    assert kept_quiet  # the owner's other key still follows the job
    assert Job.objects.get(id=job_id).status == JobStatus.IN_PROGRESS  # the job itself runs on


def test_revoking_a_key_ends_its_event_stream_with_an_error_event(redis_client):
    api_key, secret = make_api_key()
    job_id = _streaming_job(redis_client, api_key)
    path = f"/api/v1/jobs/{job_id}/events"
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": f"api_key={secret}".encode(), "root_path": "",
             "headers": [(b"host", b"localhost")], "client": ("127.0.0.1", 1), "server": ("localhost", 80)}

    async def scenario() -> tuple[int, bytes]:
        communicator = ApplicationCommunicator(application, scope)
        await communicator.send_input({"type": "http.request", "body": b"", "more_body": False})
        start = await communicator.receive_output(timeout=10)
        body = b""
        while b"event: delta" not in body:
            body += (await communicator.receive_output(timeout=5))["body"]
        await database_sync_to_async(api_key_revoke)(api_key_id=api_key.id)
        while True:
            message = await communicator.receive_output(timeout=5)
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait(timeout=5)
        return start["status"], body

    status, body = asyncio.run(scenario())

    assert status == 200
    last = body.decode().strip().split("\n\n")[-1].split("\n")
    assert last[0] == "event: error"
    assert json.loads(last[1].removeprefix("data: "))["error"]["code"] == "revoked_api_key"


def test_a_key_revoked_by_hand_in_the_admins_form_ends_its_sockets_too(redis_client):
    api_key, secret = make_api_key()
    job_id = _streaming_job(redis_client, api_key)
    staff = Client()
    staff.force_login(make_user(is_staff=True, is_superuser=True))
    form = {"owner": api_key.owner_id, "name": api_key.name, "revoked_at_0": "2026-01-02", "revoked_at_1": "03:04:05",
            **{field: getattr(api_key, field) for field in QUOTA_FIELDS}}

    async def scenario() -> tuple[int, dict, dict]:
        following = await _open(f"/ws/v1/jobs/{job_id}/?api_key={secret}")
        assert (await following.receive_json_from(timeout=5))["type"] == "delta"
        saved = await asyncio.to_thread(staff.post, f"/admin/api/apikey/{api_key.id}/change/", form)
        return saved.status_code, *await _error_and_close(following)

    status, message, closed = asyncio.run(scenario())

    assert status == 302  # saved
    assert ApiKey.objects.get(id=api_key.id).revoked_at is not None
    assert message["error"]["code"] == "revoked_api_key" and closed["code"] == 4401
