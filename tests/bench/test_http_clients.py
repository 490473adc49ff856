"""bench/http_clients.py: the benchmarks' event-loop HTTP clients, against a local asyncio server."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from http_clients import get_json, post_job  # noqa: E402


async def _serve(answer: bytes, *, delay_s: float = 0.0):
    """A server on a free port that reads one request head (and its body) and sends ``answer``
    after ``delay_s``; returns (server, port, the request lines it read)."""
    requests: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        requests.append(head + (await reader.readexactly(length) if length else b""))
        await asyncio.sleep(delay_s)
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], requests


def _plain(status: str, body: dict) -> bytes:
    raw = json.dumps(body).encode()
    return f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n".encode() + raw


def _chunked(status: str, body: dict) -> bytes:
    raw = json.dumps(body).encode()
    half = len(raw) // 2
    chunks = b"".join(f"{len(part):x}\r\n".encode() + part + b"\r\n" for part in (raw[:half], raw[half:]))
    return f"HTTP/1.1 {status}\r\nTransfer-Encoding: chunked\r\n\r\n".encode() + chunks + b"0\r\n\r\n"


def test_get_json_leaves_the_event_loop_free_while_it_waits() -> None:
    """The affinity bench fetches each answer while the other conversations read their streams: a
    client that blocked the loop would hold every one of their first tokens for the answer's time."""
    async def main() -> tuple[dict, int, list[bytes]]:
        server, port, requests = await _serve(_plain("200 OK", {"output_text": "hi"}), delay_s=0.3)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        try:
            body = await get_json(port, "k1", "/api/v1/jobs/abc")
        finally:
            ticker.cancel()
            server.close()
        return body, ticks, requests

    body, ticks, requests = asyncio.run(main())
    assert body == {"output_text": "hi"}
    assert ticks >= 10  # 0.3 s of waiting: the loop ran the ticker meanwhile
    assert requests[0].startswith(b"GET /api/v1/jobs/abc HTTP/1.1\r\n")
    assert b"Authorization: Bearer k1\r\n" in requests[0]


def test_a_chunked_answer_is_read_whole() -> None:
    async def main() -> dict:
        server, port, _ = await _serve(_chunked("200 OK", {"output_text": "a longer answer", "n": 3}))
        try:
            return await get_json(port, "k", "/x")
        finally:
            server.close()

    assert asyncio.run(main()) == {"output_text": "a longer answer", "n": 3}


def test_a_status_other_than_the_expected_one_raises_with_the_body() -> None:
    async def main(answer: bytes, call: str) -> None:
        server, port, _ = await _serve(answer)
        try:
            if call == "get":
                await get_json(port, "k", "/x")
            else:
                await post_job(port, "k", {"prompt": "p"})
        finally:
            server.close()

    with pytest.raises(RuntimeError, match="GET /x answered 404: .*not found"):
        asyncio.run(main(_plain("404 Not Found", {"detail": "not found"}), "get"))
    with pytest.raises(RuntimeError, match="POST /api/v1/jobs answered 429: .*quota"):
        asyncio.run(main(_plain("429 Too Many Requests", {"detail": "quota"}), "post"))


def test_post_job_sends_the_body_and_returns_the_id() -> None:
    async def main() -> tuple[str, list[bytes]]:
        server, port, requests = await _serve(_plain("202 Accepted", {"id": "job-1"}))
        try:
            job_id, _sent = await post_job(port, "k", {"prompt": "p", "max_tokens": 4})
        finally:
            server.close()
        return job_id, requests

    job_id, requests = asyncio.run(main())
    assert job_id == "job-1"
    assert requests[0].startswith(b"POST /api/v1/jobs HTTP/1.1\r\n")
    assert requests[0].endswith(json.dumps({"prompt": "p", "max_tokens": 4}).encode())
