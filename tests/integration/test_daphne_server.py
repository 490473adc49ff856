"""daphne as the service runs it (inference_service/daphne_server.py), as a real subprocess: no API
key in its log on any door, over-long request heads answered, oversized WebSocket messages closed
with 1009 and a reason."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import websockets

from tests.api.factories import make_api_key
from tests.integration.jobs import queue_job
from tests.integration.procs import START_TIMEOUT_S, Proc, free_port, port_open, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _start(env: dict[str, str], port: int, log_dir: Path, *args: str) -> Proc:
    argv = [sys.executable, "-m", "inference_service.daphne_server", "-b", "127.0.0.1", "-p", str(port), *args,
            "inference_service.asgi:application"]
    proc = Proc("daphne", argv, env, log_dir)
    wait_for(lambda: port_open(port) or not proc.alive(), START_TIMEOUT_S, "daphne to listen")
    assert proc.alive(), proc.log_tail()
    return proc


def _http(port: int, path: str, *, method: str = "GET", headers: dict[str, str] | None = None,
          body: bytes | None = None) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method,
                                     headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _raw(port: int, head: bytes) -> bytes:
    """Send ``head`` on a fresh connection and read what comes back until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        try:
            sock.sendall(head)
        except OSError:  # the server answered and closed before taking all of it
            pass
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


async def _close_of(url: str, send: str | None = None) -> websockets.frames.Close | None:
    async with websockets.connect(url, open_timeout=60, max_size=None) as ws:
        if send is not None:
            await ws.send(send)
        try:
            while True:
                await asyncio.wait_for(ws.recv(), 30)
        except websockets.ConnectionClosed as closed:
            return closed.rcvd


def test_no_api_key_reaches_the_log_on_any_door(service_env, tmp_path):
    """Every door that takes ``?api_key=`` (and names an attacker might try), with daphne's access
    log and every logger at their most verbose."""
    api_key, secret = make_api_key()
    job_id = queue_job("Once upon a time", max_tokens=4, dispatch=False, api_key=api_key)
    port = free_port()
    web = _start({**service_env, "LOG_LEVEL": "DEBUG"}, port, tmp_path, "-v", "2")
    base = f"ws://127.0.0.1:{port}"
    try:
        statuses = [
            _http(port, f"/api/v1/jobs/{uuid.uuid4()}/events?api_key={secret}"),  # the SSE door
            _http(port, f"/api/v1/jobs/{job_id}?API_KEY={secret}&after=1"),  # not a way in, still a secret
            _http(port, f"/api/v1/nothing-here?api%5Fkey={secret}"),
            _http(port, f"/ws/v1/generate?api_key={secret}"),  # a WebSocket path without the upgrade
            _http(port, f"/v1/chat/completions?api_key={secret}", method="POST", body=b"{}",
                  headers={"Content-Type": "application/json", "Referer": f"https://app.example/?key={secret}"}),
            _http(port, "/api/v1/jobs", method="POST", body=b'{"prompt": 1}',
                  headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}),
        ]
        closes = asyncio.run(_closes(base, secret, job_id))
    finally:
        web.stop(30)
    log = web.log_path.read_text(errors="replace")

    assert statuses == [404, 401, 404, 404, 400, 400]
    assert [close.code for close in closes] == [4404, 4400]
    assert "/events?api_key=[redacted]" in log and "WSCONNECT /ws/v1/generate" in log  # what the log holds
    assert secret not in log and secret[3:20] not in log


async def _closes(base: str, secret: str, job_id: str) -> list:
    return [
        await _close_of(f"{base}/ws/v1/jobs/{uuid.uuid4()}/?api_key={secret}"),
        await _close_of(f"{base}/ws/v1/generate?api_key={secret}", send="{not json"),
    ]


def test_an_oversized_request_head_is_answered_431_or_414_in_the_error_envelope(service_env, tmp_path):
    port = free_port()
    web = _start(service_env, port, tmp_path)
    request = b"GET /api/v1/health HTTP/1.1\r\nHost: localhost\r\n"
    upgrade = (b"GET /ws/v1/generate HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n")
    try:
        answers = {
            "64 KiB Authorization": _raw(port, request + b"Authorization: Bearer " + b"x" * 65536 + b"\r\n\r\n"),
            "8 MB Cookie": _raw(port, request + b"Cookie: a=" + b"x" * 8_000_000 + b"\r\n\r\n"),
            "40 headers of 1 KB": _raw(port, request + b"".join(b"X-H%d: %s\r\n" % (i, b"y" * 1000)
                                                                for i in range(40)) + b"\r\n"),
            "600 tiny headers": _raw(port, request + b"".join(b"X-H%d: y\r\n" % i for i in range(600)) + b"\r\n"),
            "a WebSocket handshake": _raw(port, upgrade + b"Authorization: Bearer " + b"x" * 65536 + b"\r\n\r\n"),
            "after a good request": _raw(port, request + b"\r\n" + request + b"X-Big: " + b"x" * 65536 + b"\r\n\r\n"),
        }
        long_url = _raw(port, b"GET /api/v1/health?a=" + b"x" * 70_000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n")
        still_serving = _http(port, "/api/v1/health")
    finally:
        web.stop(30)

    for what, answer in answers.items():
        last = answer[answer.rindex(b"HTTP/1.1 "):]
        head, _, body = last.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 431 "), (what, answer[:300])
        assert json.loads(body)["error"]["code"] == "request_header_fields_too_large", what
    assert long_url.startswith(b"HTTP/1.1 414 ")
    assert json.loads(long_url.partition(b"\r\n\r\n")[2])["error"]["code"] == "uri_too_long"
    # The first request was served (200, or 503 from the health check when no engine worker runs).
    assert answers["after a good request"].startswith((b"HTTP/1.1 200 ", b"HTTP/1.1 503 "))
    assert still_serving in (200, 503)


def test_a_websocket_message_over_one_mib_is_closed_with_1009_and_a_reason(service_env, tmp_path):
    _, secret = make_api_key()
    port = free_port()
    web = _start(service_env, port, tmp_path)
    url = f"ws://127.0.0.1:{port}/ws/v1/generate?api_key={secret}"

    async def fragmented() -> websockets.frames.Close | None:
        async with websockets.connect(url, open_timeout=60, max_size=None) as ws:
            await ws.send(["x" * 256 * 1024 for _ in range(5)])  # one message of small frames
            try:
                while True:
                    await asyncio.wait_for(ws.recv(), 30)
            except websockets.ConnectionClosed as closed:
                return closed.rcvd

    try:
        one_frame = asyncio.run(_close_of(url, send="x" * (1 << 20) + "x"))
        many_frames = asyncio.run(fragmented())
    finally:
        web.stop(30)

    for close in (one_frame, many_frames):
        assert close is not None and close.code == 1009
        assert "exceeds payload limit" in close.reason
