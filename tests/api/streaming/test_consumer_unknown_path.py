"""A WebSocket to a path no consumer serves gets the error envelope and close code 4404 (before,
Channels' router raised and daphne refused the handshake with HTTP 500)."""

from __future__ import annotations

import asyncio

import pytest
from channels.testing import WebsocketCommunicator

from inference_service.asgi import application
from tests.api.factories import make_api_key

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("consumer_connections_closed"),
]


@pytest.mark.parametrize("path", ["/ws/v1/jobs/not-a-uuid/", "/ws/v1/nope", "/ws/v2/generate", "/"])
def test_an_unknown_websocket_path_is_answered_with_an_error_and_4404(path):
    _, secret = make_api_key()

    async def scenario() -> tuple[bool, dict, dict]:
        communicator = WebsocketCommunicator(application, f"{path}?api_key={secret}")
        connected, _ = await communicator.connect(timeout=10)
        message = await communicator.receive_json_from(timeout=10)
        closed = await communicator.receive_output(timeout=10)
        await communicator.disconnect()
        return connected, message, closed

    connected, message, closed = asyncio.run(scenario())

    assert connected
    assert message["type"] == "error"
    assert message["error"]["code"] == "not_found" and path in message["error"]["message"]
    assert closed == {"type": "websocket.close", "code": 4404}


def test_the_known_paths_still_reach_their_consumers():
    _, secret = make_api_key()

    async def scenario() -> dict:
        communicator = WebsocketCommunicator(application, f"/ws/v1/jobs/00000000-0000-0000-0000-000000000000/"
                                                          f"?api_key={secret}")
        await communicator.connect(timeout=10)
        message = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        return message

    # The job consumer's own answer: a well-formed id that is nobody's job.
    assert asyncio.run(scenario())["error"]["code"] == "job_not_found"


def test_a_client_that_left_before_the_error_reaches_it_ends_the_consumer_quietly():
    """Between a client's close frame and its disconnect event daphne hands sends to autobahn,
    which raises Disconnected: the consumer ends without raising out of the application (daphne
    logged each such raise as an "Exception inside application" traceback)."""
    from autobahn.exception import Disconnected

    sent: list[dict] = []

    async def scenario() -> None:
        inbox: asyncio.Queue[dict] = asyncio.Queue()
        await inbox.put({"type": "websocket.connect"})

        async def send(message: dict) -> None:
            sent.append(message)
            if message["type"] == "websocket.send":
                await inbox.put({"type": "websocket.disconnect", "code": 1000})
                raise Disconnected("Attempt to send on a closed protocol")

        scope = {"type": "websocket", "path": "/ws/v1/nope", "query_string": b"", "headers": [],
                 "subprotocols": []}
        await asyncio.wait_for(application(scope, inbox.get, send), 10)

    asyncio.run(scenario())

    assert [m["type"] for m in sent][:2] == ["websocket.accept", "websocket.send"]
    assert '"not_found"' in sent[1]["text"]
