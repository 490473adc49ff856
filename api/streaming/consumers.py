"""WebSocket consumers.

* ``/ws/v1/jobs/<id>/?after=<seq>``: a job's deltas ``{"type": "delta", "seq", "text", ...}``
  (every chunk after ``after`` exactly once, in order), then one ``{"type": "final", ...}``.
* ``/ws/v1/generate``: the client sends one JSON job body (as ``POST /api/v1/jobs``); the server
  answers ``{"type": "job", "id", "status"}`` and then streams that job the same way.

While a job streams, either socket takes ``{"type": "cancel"}``: the job is cancelled as by
``POST /api/v1/jobs/<id>/cancel``, and its final (status ``cancelled``) ends the stream. A job that
already finished, or any other message, gets an error message, and the stream goes on.

Authentication: ``Authorization: Bearer <key>`` or ``?api_key=<key>``. The key is read again for
each submission and each cancel, as REST reads it for each request, and a socket whose key is
revoked while it is open ends at once (api/keys/revocation.py). Close codes: 4401 missing, bad or
revoked key; 4404 a job that does not exist or belongs to someone else (``job_not_found``), or a
path that is neither of the two (``/ws/v1/jobs/not-a-uuid/``, ``not_found``); 4400 bad input; 4503
no stream to follow (Redis is down) or the database is unavailable; 4500 an internal error. Both
close after the final message (1000). docs/streaming.md lists every close code, daphne's too.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from autobahn.exception import Disconnected
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from rest_framework.exceptions import ParseError

from api.common.errors import (
    DATABASE_UNAVAILABLE_ERRORS,
    ApiKeyRevoked,
    AuthenticationFailed,
    JobNotFound,
    ServiceError,
    ServiceUnavailable,
    database_unavailable,
    error_body,
)
from api.common.exception_handler import exception_handler
from api.common.parsers import parse_json
from api.jobs.serializers import JobCreateSerializer
from api.jobs.services.cancel import job_cancel
from api.jobs.services.submission import JobRequest, job_create
from api.keys.authentication import authenticate_api_key, authenticate_api_key_for_job, bearer_token
from api.keys.revocation import KeyRevocationEvents
from api.models import ApiKey, Job
from api.streaming.follow import FollowsJob

logger = logging.getLogger(__name__)

CLOSE_BAD_REQUEST = 4400
CLOSE_UNAUTHORIZED = 4401
CLOSE_NOT_FOUND = 4404
# The service cannot serve now (Redis or the database is down): retry. Not RFC 6455's 1011:
# daphne's autobahn takes only 1000 and 3000-4999 from an application, and raised for 1011.
CLOSE_UNAVAILABLE = 4503
CLOSE_INTERNAL_ERROR = 4500


_CLOSE_CODES = {401: CLOSE_UNAUTHORIZED, 404: CLOSE_NOT_FOUND, 503: CLOSE_UNAVAILABLE}


def close_code_for(status: int) -> int:
    """The close code of an error of HTTP status ``status``: 4401, 4404, 4503, 4500 for another
    server error, and 4400 (bad input) for any other client error."""
    return _CLOSE_CODES.get(status) or (CLOSE_INTERNAL_ERROR if status >= 500 else CLOSE_BAD_REQUEST)


class JobStreamConsumer(KeyRevocationEvents, FollowsJob, AsyncWebsocketConsumer):
    """Streams one existing job (its relay runs as a task of this consumer, see follow.py)."""

    api_key: ApiKey | None = None

    async def connect(self) -> None:
        await self.accept()  # custom close codes need an accepted socket
        job_id = str(self.scope["url_route"]["kwargs"]["job_id"])
        await self.join_key_group(scope_api_key(self.scope))
        try:
            self.api_key, owns = await authorize_job(scope_api_key(self.scope), job_id)
        except ServiceError as exc:  # AuthenticationFailed, DatabaseUnavailable
            await self._refuse(exc)
            return
        query = parse_qs(self.scope.get("query_string", b"").decode())
        try:
            after = int(query.get("after", ["0"])[0])
            if after < 0:
                raise ValueError(after)
        except ValueError:
            await self._error("'after' must be a non-negative integer.", code="invalid_after", param="after")
            return
        if not owns:
            await self._refuse(JobNotFound(job_id))
            return
        await self.stream_job(job_id, after)

    async def stream_job(self, job_id: str, after: int) -> None:
        """Follow the job's stream until its final (see relay.py)."""
        try:
            await self.open_relay(job_id, after, self._send_message)
        except ServiceUnavailable as exc:
            await self._refuse(exc)
            return
        self.follow()

    async def disconnect(self, code: int) -> None:
        self.stop_following()
        await self.leave_key_group()

    async def job_gone(self, exc: JobNotFound) -> None:
        await self._refuse(exc)

    async def relay_failed(self) -> None:
        await self._refuse(ServiceUnavailable("The job's stream failed; poll GET /api/v1/jobs/<id>."))

    async def key_revoked(self) -> None:
        await self._end_unauthorized(ApiKeyRevoked())

    async def _end_unauthorized(self, exc: AuthenticationFailed) -> None:
        """The stream ends here: nothing more of the job for a key no longer valid (the job runs on)."""
        if self.relay is not None and self.relay.done:
            return  # the final went out: the socket is closing anyway
        self.stop_following()
        self.relay = None
        await self._refuse(exc)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.relay is None or self.relay.done or self.api_key is None:
            return  # not streaming (yet, or any more): nothing to control
        try:
            message = parse_json(text_data or "")
        except ParseError:
            message = None
        if message != {"type": "cancel"}:
            await self._notice('While a job streams, the only message is {"type": "cancel"}.',
                               code="invalid_message")
            return
        try:
            await cancel_job_as(scope_api_key(self.scope), self.relay.job_id)
        except AuthenticationFailed as exc:  # revoked (or its owner disabled) since the socket opened
            await self._end_unauthorized(exc)
        except ServiceError as exc:  # JobNotCancellable: it finished meanwhile; its final follows
            await self._notice(exc.message, code=exc.code)

    # -- helpers ------------------------------------------------------------------------------

    async def send(self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False) -> None:
        """Channels' send, except to a client that has already gone. Between the client's close
        frame and the disconnect event that follows it, daphne hands a send to autobahn, which raises
        ``Disconnected``; a server keeping to the ASGI spec raises an ``OSError``. Either way there is
        nobody to tell, and the disconnect event ends the consumer as usual, where raising would log
        an "Exception inside application" traceback for it."""
        try:
            await super().send(text_data=text_data, bytes_data=bytes_data, close=close)
        except (Disconnected, OSError):
            logger.debug("WebSocket %s: the client left before a message could reach it", self.scope.get("path"))

    async def _send_message(self, message: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(message))
        if message["type"] == "final":
            self.stop_following()
            await self.close()

    async def _authenticate(self) -> bool:
        try:
            self.api_key = await db_thread(authenticate_api_key)(scope_api_key(self.scope))
        except ServiceError as exc:  # AuthenticationFailed, DatabaseUnavailable
            await self._refuse(exc)
            return False
        return True

    async def _refuse(self, exc: ServiceError) -> None:
        """``exc`` as an error message, then the close code of its status."""
        await self._error(exc.message, code=exc.code, param=exc.param, error_type=exc.error_type,
                          close_code=close_code_for(exc.status_code))

    async def _error(self, message: str, *, code: str, param: str | None = None,
                     close_code: int = CLOSE_BAD_REQUEST, error_type: str = "invalid_request_error") -> None:
        await self._notice(message, code=code, param=param, error_type=error_type)
        await self.close(code=close_code)

    async def _notice(self, message: str, *, code: str, param: str | None = None,
                      error_type: str = "invalid_request_error") -> None:
        """An error message that leaves the socket open."""
        body = error_body(message, error_type=error_type, code=code, param=param)
        await self.send(text_data=json.dumps({"type": "error", **body}))


class UnknownPathConsumer(JobStreamConsumer):
    """Any other WebSocket path. Without it Channels' router raises for the path, and daphne
    logs a traceback and refuses the handshake with HTTP 500; the client gets what an unknown
    job gets instead: the error envelope, then close code 4404."""

    async def connect(self) -> None:
        await self.accept()
        await self._error(f"Unknown URL: {self.scope['path']}", code="not_found", close_code=CLOSE_NOT_FOUND)


class GenerateConsumer(JobStreamConsumer):
    """Submits a job from the first message and streams it on the same socket."""

    async def connect(self) -> None:
        await self.accept()
        await self.join_key_group(scope_api_key(self.scope))
        await self._authenticate()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.relay is not None:  # streaming its job: control messages
            await super().receive(text_data, bytes_data)
            return
        if self.api_key is None:
            return  # unauthenticated: closing
        try:
            body = parse_json(text_data or "")
        except ParseError:
            await self._error("The message is not valid JSON.", code="invalid_json")
            return
        try:
            # The key is read again, as REST reads it for each request: it may have been revoked,
            # or its quotas changed, since the socket opened.
            job = await _create_job(scope_api_key(self.scope), body)
        except Exception as exc:  # mapped exactly like the REST API maps it
            response = exception_handler(exc, {"view": self})
            status = response.status_code if response is not None else 500
            if status >= 500 and status != 503:
                logger.exception("job creation over WebSocket failed")
            data = response.data if response is not None else {}
            await self.send(text_data=json.dumps({"type": "error", **data}))
            await self.close(code=close_code_for(status))
            return
        await self.send(text_data=json.dumps({"type": "job", "id": str(job.id), "status": job.status}))
        await self.stream_job(str(job.id), 0)


def scope_api_key(scope: dict[str, Any]) -> str | None:
    """The API key of a connection's scope: ``Authorization: Bearer <key>``, else ``?api_key=``
    (browsers cannot set headers on a WebSocket or an EventSource)."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            token = bearer_token(value.decode("latin-1"))
            if token:
                return token
    query = parse_qs(scope.get("query_string", b"").decode())
    return query.get("api_key", [None])[0]


def db_thread(func: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``func`` (ORM code) off the event loop on a thread of its own. Channels' default
    (thread_sensitive) runs every consumer's DB call of the process on one shared thread, where a
    burst of connections would queue one after another. A lost database connection comes out as
    DatabaseUnavailable (a ServiceError, 503), as the REST API answers it; Channels then discards
    the connection (``close_old_connections`` after the call)."""

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except DATABASE_UNAVAILABLE_ERRORS as exc:
            raise database_unavailable(exc, func.__name__) from exc

    return database_sync_to_async(call, thread_sensitive=False)


@db_thread
def authorize_job(raw_key: str | None, job_id: str) -> tuple[ApiKey, bool]:
    """The caller's key (or AuthenticationFailed) and whether the job is theirs: one thread hop,
    one query."""
    return authenticate_api_key_for_job(raw_key, job_id)


@db_thread
def cancel_job(api_key: ApiKey, job_id: str) -> None:
    job_cancel(job_id=job_id, owner=api_key.owner)


@db_thread
def cancel_job_as(raw_key: str | None, job_id: str) -> None:
    """Cancel the job for the key whose secret is ``raw_key``, read now (AuthenticationFailed if it
    is no longer valid), as ``POST /api/v1/jobs/<id>/cancel`` does."""
    job_cancel(job_id=job_id, owner=authenticate_api_key(raw_key).owner)


@db_thread
def _create_job(raw_key: str | None, body: Any) -> Job:
    """Authenticate (the key as stored now), validate and create the job: one thread hop."""
    api_key = authenticate_api_key(raw_key)
    if not isinstance(body, dict):
        raise ServiceError("The message must be a JSON object (a job body).", code="invalid_request")
    serializer = JobCreateSerializer(data=body)
    serializer.is_valid(raise_exception=True)
    return job_create(
        owner=api_key.owner, api_key=api_key, request=JobRequest.from_validated(serializer.validated_data)
    ).job
