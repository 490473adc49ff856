"""The benchmark's own HTTP clients: one request per new connection, on the event loop, parsed by
hand so that the client adds as little as it can to what it measures (bench/service_bench.py)."""

from __future__ import annotations

import asyncio
import json
import time


async def send_post(port: int, key: str, path: str, payload: bytes) -> tuple[
        asyncio.StreamReader, asyncio.StreamWriter, float]:
    """Open a new connection to the service on ``port`` and write one POST of ``payload`` (JSON) to
    ``path`` with ``key``: (reader, writer, perf_counter when it was written). The caller reads the
    answer and closes the writer."""
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head.encode() + payload)
    return reader, writer, time.perf_counter()


async def post_job(port: int, key: str, body: dict) -> tuple[str, float]:
    """POST a job on a new connection, on the event loop: (its id, perf_counter when the request
    was written). On the event loop, not on threads, so a burst's requests are written at once
    instead of taking turns at this process's GIL."""
    reader, writer, sent = await send_post(port, key, "/api/v1/jobs", json.dumps(body).encode())
    status, raw = await _answer(reader, writer)
    if status != 202:
        raise RuntimeError(f"POST /api/v1/jobs answered {status}: {raw[:300]!r}")
    return json.loads(raw)["id"], sent


async def get_json(port: int, key: str, path: str) -> dict:
    """GET ``path`` with ``key`` on a new connection, on the event loop (a blocking client there
    would stall every other request's reads while it waits), and parse its JSON answer. Raises on
    any status but 200."""
    head = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\n"
            "Connection: close\r\n\r\n")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head.encode())
    status, raw = await _answer(reader, writer)
    if status != 200:
        raise RuntimeError(f"GET {path} answered {status}: {raw[:300]!r}")
    return json.loads(raw)


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[int, bytes]:
    """Send what was written, read the whole answer (:func:`_read_response`), close the connection."""
    try:
        await writer.drain()
        return await _read_response(reader)
    finally:
        writer.close()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """An HTTP/1.1 answer's status and whole body (by its length, chunked, or to the close)."""
    status = (await reader.readline()).split(maxsplit=2)
    length, chunked = None, False
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
        chunked |= name.strip().lower() == "transfer-encoding" and "chunked" in value.lower()
    if chunked:
        raw = b""
        while size := int((await reader.readline()).split(b";")[0], 16):
            raw += (await reader.readexactly(size + 2))[:-2]
    else:
        raw = await (reader.readexactly(length) if length is not None else reader.read())
    return int(status[1]) if len(status) >= 2 and status[1].isdigit() else 0, raw


async def openai_stream(port: int, key: str, body: dict, t0: float) -> tuple[str, float, int]:
    """POST a streamed completion on a new connection and read its events until ``[DONE]``:
    (its job's id, seconds from ``t0`` to the first text, completion tokens of the usage chunk)."""
    reader, writer, _ = await send_post(port, key, "/v1/completions", json.dumps(body).encode())
    first, completion, buffer, job_id = None, None, b"", ""
    try:
        await writer.drain()
        status = (await reader.readline()).split(maxsplit=2)
        chunked = False
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            chunked |= name.strip().lower() == "transfer-encoding" and "chunked" in value.lower()
        if len(status) < 2 or status[1] != b"200":
            raise RuntimeError(f"POST /v1/completions answered {status!r}: {(await reader.read())[:300]!r}")
        while True:
            if chunked:
                size = int((await reader.readline()).split(b";")[0], 16)
                data = await reader.readexactly(size + 2)
                data = data[:-2]
                if size == 0:
                    break
            else:
                data = await reader.read(65536)
                if not data:
                    break
            buffer += data
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                if not event.startswith(b"data: "):
                    continue  # a keep-alive comment
                if event == b"data: [DONE]":
                    return job_id, first or 0.0, completion or 0
                chunk = json.loads(event[len(b"data: "):])
                job_id = job_id or chunk.get("id", "").removeprefix("cmpl-")
                if "error" in chunk:
                    raise RuntimeError(chunk)
                if chunk.get("usage"):
                    completion = chunk["usage"]["completion_tokens"]
                if first is None and chunk["choices"] and chunk["choices"][0]["text"]:
                    first = time.perf_counter() - t0
    finally:
        writer.close()
    raise RuntimeError("the completion stream closed before [DONE]")


async def openai_complete(port: int, key: str, body: dict) -> int:
    """POST a completion without ``stream`` on a new connection and wait for its answer (plain or
    chunked); returns its usage's completion tokens. Raises on any status but 200."""
    reader, writer, _ = await send_post(port, key, "/v1/completions", json.dumps(body).encode())
    status, raw = await _answer(reader, writer)
    if status != 200:
        raise RuntimeError(f"POST /v1/completions answered {status}: {raw[:300]!r}")
    return int(json.loads(raw)["usage"]["completion_tokens"])
