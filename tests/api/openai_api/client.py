"""Helpers of the OpenAI-compatible endpoint tests: requests through the real ASGI application,
and a stand-in engine worker that claims a job and publishes its output through the real sink
(database, Redis stream, channel layer)."""

from __future__ import annotations

import json
from typing import Any

from channels.db import database_sync_to_async
from channels.testing import ApplicationCommunicator

from api.jobs.services.claim import job_claim
from api.worker.sink import RedisJobSink
from engine_worker.protocol import FinalResult, OutputChunk, StepBatch
from inference_service.asgi import application

WORKER = "w-openai"


def scope(path: str, *, secret: str | None, method: str = "POST",
          headers: list[tuple[bytes, bytes]] = ()) -> dict:
    auth = [(b"authorization", f"Bearer {secret}".encode())] if secret else []
    if not any(name == b"content-type" for name, _ in headers):
        headers = [(b"content-type", b"application/json"), *headers]
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"host", b"localhost"), *auth, *headers],
            "client": ("127.0.0.1", 1), "server": ("localhost", 80)}


class Response:
    def __init__(self, start: dict, chunks: list[bytes]) -> None:
        self.status = start["status"]
        self.headers = {k.decode(): v.decode() for k, v in start["headers"]}
        self.body = b"".join(chunks)

    def json(self) -> Any:
        return json.loads(self.body)

    def data_events(self) -> list[Any]:
        """The ``data:`` payloads of an event stream, parsed, with ``[DONE]`` as the string."""
        out = []
        for block in self.body.decode().split("\n\n"):
            for line in block.split("\n"):
                if line.startswith("data: "):
                    value = line[len("data: "):]
                    out.append(value if value == "[DONE]" else json.loads(value))
        return out


class Exchange:
    """One request in flight: send it, read its response, or drop the connection."""

    def __init__(self, path: str, body: Any, *, secret: str | None, method: str = "POST",
                 headers: list[tuple[bytes, bytes]] = ()) -> None:
        self.communicator = ApplicationCommunicator(application, scope(path, secret=secret, method=method,
                                                                       headers=headers))
        self._body = body if isinstance(body, bytes) else json.dumps(body).encode()
        self._start: dict | None = None
        self._chunks: list[bytes] = []

    async def send(self) -> None:
        await self.communicator.send_input({"type": "http.request", "body": self._body, "more_body": False})

    async def start(self, timeout: float = 10) -> dict:
        """The response's start (status and headers)."""
        if self._start is None:
            self._start = await self.communicator.receive_output(timeout=timeout)
            assert self._start["type"] == "http.response.start", self._start
        return self._start

    async def next_body(self, timeout: float = 10) -> bytes:
        await self.start()
        message = await self.communicator.receive_output(timeout=timeout)
        self._chunks.append(message.get("body", b""))
        return message.get("body", b"")

    async def read(self, timeout: float = 10) -> Response:
        """The whole response; then the connection ends, as daphne ends it."""
        start = await self.start(timeout)
        while True:
            message = await self.communicator.receive_output(timeout=timeout)
            self._chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        await self.disconnect()
        return Response(start, self._chunks)

    async def disconnect(self) -> None:
        await self.communicator.send_input({"type": "http.disconnect"})
        await self.communicator.wait(timeout=10)


async def request(path: str, body: Any, *, secret: str | None, method: str = "POST",
                  headers: list[tuple[bytes, bytes]] = ()) -> Response:
    exchange = Exchange(path, body, secret=secret, method=method, headers=headers)
    await exchange.send()
    return await exchange.read()


@database_sync_to_async
def run_job(job_id: str, texts: list[str], *, finish_reason: str = "stop", error: str | None = None,
            cached_tokens: int = 0, logprobs: tuple | None = None) -> None:
    """What an engine worker does for the job: claim it, publish one chunk per text, then the
    final, through the worker's own sink. ``logprobs``: one entry per text (a token each), on its
    chunk, and all of them on the final."""
    job = job_claim(job_id=job_id, worker_id=WORKER, lease_s=30)
    assert job is not None, "the job was not claimable"
    sink = RedisJobSink(worker_id=WORKER, redis_client=_redis())
    for seq, text in enumerate(texts, start=1):
        chunk_logprobs = None if logprobs is None else (logprobs[seq - 1],)
        sink.publish(StepBatch(chunks=(OutputChunk(job_id=job_id, seq=seq, text=text, completion_tokens=seq,
                                                   logprobs=chunk_logprobs),)))
    sink.publish(StepBatch(finals=(FinalResult(
        job_id=job_id, text="".join(texts), finish_reason=finish_reason, prompt_tokens=len(job.prompt_token_ids),
        completion_tokens=len(texts), cached_tokens=cached_tokens, error=error, last_seq=len(texts),
        logprobs=logprobs),)))


def _redis():
    from api.common.redis_client import get_redis

    return get_redis()
