"""A small HTTP + WebSocket client for the end-to-end tests (stdlib HTTP, ``websockets``)."""

from __future__ import annotations

import asyncio
import http.client
import json
import urllib.error
import urllib.request
from typing import Any

import websockets

FINISHED = ("completed", "failed", "cancelled", "expired")


class ServiceClient:
    def __init__(self, port: int, secret: str) -> None:
        self.http = f"http://127.0.0.1:{port}"
        self.ws = f"ws://127.0.0.1:{port}"
        self.secret = secret

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.http + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.secret}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    async def submit(self, body: dict[str, Any]) -> str:
        status, data = await asyncio.to_thread(self._request, "POST", "/api/v1/jobs", body)
        assert status == 202, data
        return data["id"]

    async def get(self, job_id: str) -> dict[str, Any]:
        status, data = await asyncio.to_thread(self._request, "GET", f"/api/v1/jobs/{job_id}")
        assert status == 200, data
        return data

    async def cancel(self, job_id: str) -> dict[str, Any]:
        status, data = await asyncio.to_thread(self._request, "POST", f"/api/v1/jobs/{job_id}/cancel")
        assert status in (200, 202), data
        return data

    async def poll(self, job_id: str, timeout: float = 240.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                data = await self.get(job_id)
                if data["status"] in FINISHED:
                    return data
                await asyncio.sleep(0.2)

    def connect(self, path: str, *, auth: bool = True) -> Any:
        headers = {"Authorization": f"Bearer {self.secret}"} if auth else None
        return websockets.connect(self.ws + path, additional_headers=headers, open_timeout=60)

    async def stream(self, job_id: str, after: int = 0, limit: int | None = None,
                     timeout: float = 240.0) -> list[dict[str, Any]]:
        """Messages of ``/ws/v1/jobs/<id>/?after=`` until the final (or ``limit`` deltas)."""
        received: list[dict[str, Any]] = []
        async with asyncio.timeout(timeout), self.connect(f"/ws/v1/jobs/{job_id}/?after={after}") as ws:
            async for raw in ws:
                message = json.loads(raw)
                received.append(message)
                if message["type"] in ("final", "error"):
                    break
                if limit is not None and sum(m["type"] == "delta" for m in received) >= limit:
                    break
        return received


    def events(self, job_id: str, *, last_event_id: str | None = None, limit: int | None = None,
               timeout: float = 240.0) -> tuple[int, list[dict[str, Any]]]:
        """``GET /api/v1/jobs/<id>/events`` read as a stream, line by line (blocking: run it in a
        thread): the status and the events as {"id", "event", "data"}, until the response ends or
        ``limit`` deltas came (then the connection is dropped, as a client that goes away)."""
        conn = http.client.HTTPConnection(self.http.removeprefix("http://"), timeout=timeout)
        headers = {"Authorization": f"Bearer {self.secret}", "Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        try:
            conn.request("GET", f"/api/v1/jobs/{job_id}/events", headers=headers)
            response = conn.getresponse()
            events: list[dict[str, Any]] = []
            current: dict[str, Any] = {}
            while response.status == 200:
                line = response.readline()
                if not line:
                    break  # the response ended
                line = line.decode().rstrip("\n")
                if line:
                    name, _, value = line.partition(": ")
                    if not line.startswith(":"):
                        current[name] = json.loads(value) if name == "data" else value
                    continue
                if "event" in current:
                    events.append(current)
                    if limit is not None and sum(e["event"] == "delta" for e in events) >= limit:
                        break
                current = {}
            return response.status, events
        finally:
            conn.close()


def deltas(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in messages if m["type"] == "delta"]


def text_of(messages: list[dict[str, Any]]) -> str:
    return "".join(m["text"] for m in deltas(messages))
