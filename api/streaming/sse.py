"""Server-sent events: ``GET /api/v1/jobs/<id>/events`` streams a job as ``text/event-stream``.

The same stream as the WebSocket ``/ws/v1/jobs/<id>/``, for clients that only speak HTTP
(``curl -N``, a browser's ``EventSource``, most HTTP libraries): every chunk exactly once and in
order, then the final, through the same :class:`JobStreamRelay` (which reads the job's Redis
stream). Each message is one event::

    id: 3
    event: delta
    data: {"type": "delta", "job_id": "...", "seq": 3, "text": " a", "completion_tokens": 3}

``event`` is ``delta``, ``final`` (then the response ends) or ``reset`` (the job restarts on
another worker: drop the text so far). ``id`` is the message's seq, so a client that reconnects
with ``Last-Event-ID`` (EventSource does it by itself) resumes after it; ``?after=<seq>`` does the
same on a first request. The final's id is ``<seq>:final``, and a request that comes back with it
is answered 204, which tells an EventSource to stop reconnecting. A comment line every
``SSE_KEEPALIVE_S`` seconds keeps idle connections open through proxies.

Authentication as on the WebSocket: ``Authorization: Bearer <key>`` or ``?api_key=<key>``.
Errors before the stream starts are the API's JSON envelope with its status: 401, 404 (not the
key owner's job), 400 (a bad ``after`` or ``Last-Event-ID``), 405 (not a GET), 503 (Redis is
down: no stream to follow, but the job itself is safe in the database; or the database is
unavailable). A key revoked while its stream is open ends the stream at once with an ``error``
event (``revoked_api_key``, api/keys/revocation.py); an EventSource that reconnects then gets the
401, which stops it.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs

from channels.exceptions import StopConsumer
from channels.generic.http import AsyncHttpConsumer

from api.common.errors import ApiKeyRevoked, JobNotFound, ServiceError, ServiceUnavailable, error_body
from api.keys.revocation import KeyRevocationEvents
from api.streaming.consumers import authorize_job, scope_api_key
from api.streaming.follow import FollowsJob
from api.streaming.http_stream import HttpStreamMixin

FINAL_ID_SUFFIX = ":final"
RETRY_MS = 1000  # how soon an EventSource reconnects after a dropped connection


class JobEventsConsumer(HttpStreamMixin, KeyRevocationEvents, FollowsJob, AsyncHttpConsumer):

    async def http_request(self, message: dict[str, Any]) -> None:
        """AsyncHttpConsumer's, except that the consumer stays alive once the request is in: the
        relay keeps sending until the final ends the response (daphne then sends
        ``http.disconnect``, as it does when the client goes away)."""
        if "body" in message:
            self.body.append(message["body"])
        if not message.get("more_body"):
            await self._open()

    async def disconnect(self) -> None:
        self.stop_keepalive()
        self.stop_following()
        await self.leave_key_group()

    async def job_gone(self, exc: JobNotFound) -> None:
        await self._event({"type": "error", **error_body(exc.message, error_type=exc.error_type, code=exc.code,
                                                          param=exc.param)})

    async def relay_failed(self) -> None:
        await self._event({"type": "error", **error_body("The job's stream failed; poll GET /api/v1/jobs/<id>.",
                                                          error_type="server_error", code="service_unavailable")})

    async def key_revoked(self) -> None:
        """The stream ends with an ``error`` event: no more of the job for a revoked key."""
        if self._ended:
            return
        self.stop_following()
        exc = ApiKeyRevoked()
        await self._event({"type": "error", **error_body(exc.message, error_type=exc.error_type, code=exc.code)})

    async def _open(self) -> None:
        if self.scope["method"] != "GET":
            await self._reject(ServiceError(f"Method \"{self.scope['method']}\" not allowed.",
                                            code="method_not_allowed"), status=405, headers={"Allow": "GET"})
            return
        job_id = str(self.scope["url_route"]["kwargs"]["job_id"])
        await self.join_key_group(scope_api_key(self.scope))
        try:
            _, owns = await authorize_job(scope_api_key(self.scope), job_id)
        except ServiceError as exc:  # AuthenticationFailed, DatabaseUnavailable
            await self._reject(exc)
            return
        try:
            after, saw_final = resume_point(self.scope)
        except ValueError as exc:
            await self._reject(ServiceError(exc.args[0], code="invalid_after", param=exc.args[1]))
            return
        if not owns:
            await self._reject(JobNotFound(job_id))
            return
        if saw_final:  # the client has the whole job: no stream, and no more reconnects
            await self.send_response(204, b"")
            await self._stop()
            return
        # Before the 200: without Redis there is no stream to promise.
        try:
            await self.open_relay(job_id, after, self._event)
        except ServiceUnavailable as exc:
            await self._reject(exc, headers={"Retry-After": "1"})
            return
        await self.send_headers(status=200, headers=[
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),  # nginx would otherwise hold the events back
        ])
        await self.send_body(f"retry: {RETRY_MS}\n\n".encode(), more_body=True)
        self.start_keepalive()
        self.follow()

    async def _event(self, message: dict[str, Any]) -> None:
        """The relay's send: one message as one event."""
        if self._ended:
            return
        kind = message["type"]
        if kind == "error":  # the job was deleted while it streamed: the response ends, no id
            frame = f"event: error\ndata: {json.dumps(message)}\n\n".encode()
        else:
            suffix = FINAL_ID_SUFFIX if kind == "final" else ""
            frame = f"id: {message['seq']}{suffix}\nevent: {kind}\ndata: {json.dumps(message)}\n\n".encode()
        self._ended = kind in ("final", "error")
        await self.send_body(frame, more_body=not self._ended)

    async def _reject(self, exc: ServiceError, *, status: int | None = None,
                      headers: dict[str, str] | None = None) -> None:
        await self.send_error(exc, status=status, headers=headers)
        await self._stop()

    async def _stop(self) -> None:
        await self.disconnect()
        raise StopConsumer()


def resume_point(scope: dict[str, Any]) -> tuple[int, bool]:
    """Where a request resumes: the seq after which to send, and whether the client already had
    the final. ``Last-Event-ID`` (a reconnecting EventSource) wins over ``?after=``; an empty one
    means no event yet, as an EventSource that has none sends no header at all. Raises
    ValueError(message, param) for a value that is not ours."""
    for name, value in scope.get("headers", []):
        if name == b"last-event-id" and (raw := value.decode("latin-1").strip()):
            seq, final = (raw[: -len(FINAL_ID_SUFFIX)], True) if raw.endswith(FINAL_ID_SUFFIX) else (raw, False)
            return _seq(seq, "Last-Event-ID", "'Last-Event-ID' must be an event id of this stream."), final
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    return _seq(query.get("after", ["0"])[0], "after", "'after' must be a non-negative integer."), False


def _seq(raw: str, param: str, message: str) -> int:
    if not (raw.isascii() and raw.isdigit()):  # digits only: no sign, no spaces, no "1e3"
        raise ValueError(message, param)
    return int(raw)
