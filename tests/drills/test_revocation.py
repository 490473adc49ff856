"""Drill: a key revoked while a ``/ws/v1/generate`` socket that it opened is still open. The next
submission on that socket is refused, as REST refuses the key, and no job is made."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from tests.drills.checks import assert_no_server_errors
from tests.drills.client import DrillClient

pytestmark = [pytest.mark.drill, pytest.mark.slow, pytest.mark.timeout(300)]


def test_a_socket_opened_before_its_key_was_revoked_cannot_submit(stack):
    leaked_secret, other_secret = stack.user_keys()  # two keys of one user
    leaked, other = DrillClient(stack.port, leaked_secret), DrillClient(stack.port, other_secret)
    status, keys = leaked.call("GET", "/api/v1/keys")
    assert status == 200, keys
    [leaked_id] = [key["id"] for key in keys["results"] if key["current"]]

    async def scenario() -> tuple[list[dict], int | None]:
        async with leaked.connect("/ws/v1/generate") as ws:
            await asyncio.sleep(0.2)  # the socket is open and authenticated
            status, body = await asyncio.to_thread(other.call, "POST", f"/api/v1/keys/{leaked_id}/revoke")
            assert status == 200 and body["active"] is False, body
            replies: list[dict] = []
            try:
                # The revocation ends the socket (4401) at once; if the close has not arrived yet,
                # the submission itself is refused.
                await ws.send(json.dumps({"prompt": "Still mine?", "max_tokens": 4}))
                async with asyncio.timeout(15):
                    async for raw in ws:
                        replies.append(json.loads(raw))
                        if replies[-1]["type"] == "final":
                            break
            except (websockets.ConnectionClosed, TimeoutError):
                pass
            return replies, ws.close_code

    replies, close_code = asyncio.run(scenario())

    assert not replies or replies[0]["type"] == "error", replies
    assert not any(reply["type"] == "job" for reply in replies), replies
    assert close_code == 4401, (close_code, replies)
    assert leaked.call("GET", "/api/v1/jobs")[0] == 401  # REST refuses it too
    status, jobs = other.call("GET", "/api/v1/jobs")
    assert status == 200 and jobs["results"] == [], jobs["results"]  # and no job was made
    assert_no_server_errors(leaked, other)
