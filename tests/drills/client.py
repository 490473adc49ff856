"""A client of the running service as a user writes one from the README: REST, the job
WebSocket (with its ``reset``), ``/ws/v1/generate`` and server-sent events. It counts every 5xx."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from tests.integration.client import FINISHED, ServiceClient


@dataclass
class Followed:
    """What a job's WebSocket delivered: the text of the current attempt and the final."""

    text: str = ""
    seqs: list[int] = field(default_factory=list)
    resets: int = 0
    final: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class DrillClient(ServiceClient):
    def __init__(self, port: int, secret: str) -> None:
        super().__init__(port, secret)
        self.server_errors: list[tuple[str, int, dict[str, Any]]] = []

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        try:
            status, data = self._request(method, path, body)
        except json.JSONDecodeError:
            status, data = 599, {"error": "not JSON"}
        if status >= 500:
            self.server_errors.append((f"{method} {path}", status, data))
        return status, data

    async def submit(self, body: dict[str, Any]) -> str:
        status, data = await asyncio.to_thread(self.call, "POST", "/api/v1/jobs", body)
        assert status == 202, (status, data)
        return data["id"]

    async def submit_many(self, n: int, *, prefix: str, max_tokens: int, eos: int) -> list[str]:
        """``n`` greedy jobs that run to exactly ``max_tokens`` (the end-of-sequence token
        banned with ``logit_bias``)."""
        return list(await asyncio.gather(*(
            self.submit({"prompt": f"{prefix} {i}:", "max_tokens": max_tokens, "temperature": 0.0,
                         "logit_bias": {str(eos): -100}}) for i in range(n))))

    async def get(self, job_id: str) -> dict[str, Any]:
        status, data = await asyncio.to_thread(self.call, "GET", f"/api/v1/jobs/{job_id}")
        assert status == 200, (status, data)
        return data

    async def poll_all(self, job_ids: list[str], timeout: float) -> dict[str, dict[str, Any]]:
        """Poll until every job has ended (a 5xx is counted and polled again)."""
        done: dict[str, dict[str, Any]] = {}
        async with asyncio.timeout(timeout):
            while len(done) < len(job_ids):
                for job_id in job_ids:
                    if job_id in done:
                        continue
                    status, data = await asyncio.to_thread(self.call, "GET", f"/api/v1/jobs/{job_id}")
                    if status == 200 and data["status"] in FINISHED:
                        done[job_id] = data
                await asyncio.sleep(0.2)
        return done

    async def until_running(self, job_ids: list[str], timeout: float = 60) -> dict[str, str]:
        """Wait until every job runs and one has text (read from the list of this key's running
        jobs, one request a round); returns the worker that holds each."""
        async with asyncio.timeout(timeout):
            while True:
                status, page = await asyncio.to_thread(self.call, "GET", "/api/v1/jobs?status=in_progress&page_size=100")
                running = {body["id"]: body for body in page.get("results", [])} if status == 200 else {}
                if set(job_ids) <= set(running) and any(running[job_id]["output_text"] for job_id in job_ids):
                    return {job_id: running[job_id]["worker_id"] for job_id in job_ids}
                await asyncio.sleep(0.05)

    async def follow(self, job_id: str, timeout: float) -> Followed:
        """Follow ``/ws/v1/jobs/<id>/`` to its final. A ``reset`` (the job started again on
        another worker) discards what came before it, as the README tells a client to."""
        async with asyncio.timeout(timeout), self.connect(f"/ws/v1/jobs/{job_id}/") as ws:
            return await read_stream(ws)

    async def generate(self, body: dict[str, Any], timeout: float) -> tuple[str | None, Followed]:
        """Submit over ``/ws/v1/generate`` and follow the job on the same socket."""
        async with asyncio.timeout(timeout), self.connect("/ws/v1/generate") as ws:
            await ws.send(json.dumps(body))
            first = json.loads(await ws.recv())
            if first["type"] != "job":
                return None, Followed(error=first)
            return first["id"], await read_stream(ws)

    def sse_text(self, job_id: str) -> tuple[str, dict[str, Any] | None]:
        """The text and final of ``GET /api/v1/jobs/<id>/events`` (blocking)."""
        status, events = self.events(job_id, timeout=60)
        assert status == 200, status
        text = "".join(e["data"]["text"] for e in events if e["event"] == "delta")
        finals = [e["data"] for e in events if e["event"] == "final"]
        return text, finals[-1] if finals else None


async def read_stream(ws: Any) -> Followed:
    got = Followed()
    async for raw in ws:
        message = json.loads(raw)
        if message["type"] == "delta":
            got.text += message["text"]
            got.seqs.append(message["seq"])
        elif message["type"] == "reset":
            got.text, got.seqs, got.resets = "", [], got.resets + 1
        elif message["type"] == "final":
            got.final = message
            break
        elif message["type"] == "error":
            got.error = message
            break
    return got
