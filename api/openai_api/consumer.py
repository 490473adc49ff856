"""``POST /v1/chat/completions`` and ``POST /v1/completions``: OpenAI's API over the service's jobs.

Each request becomes a job exactly as ``POST /api/v1/jobs`` makes one (the same key, quotas,
validation and durable row; the ``x-job-id`` header names it), and the answer follows the job's
stream through the same :class:`JobStreamRelay` as the WebSocket and server-sent events:

* without ``stream``, the response is sent once the job's final arrives, with the job's text as
  the database holds it;
* with ``stream``, each chunk of the job is one ``data:`` event in OpenAI's chunk shape, then the
  finish reason (and the usage, with ``stream_options.include_usage``), then ``data: [DONE]``.

These are Channels consumers, not Django views, because a request lasts as long as its job: a
request thread per waiting client would bound how many can wait at once.

A client that goes away before the end cancels its job, as OpenAI's and vLLM's servers stop
generating for a closed connection. With an ``Idempotency-Key`` the job is kept instead: the
client said it will come back for it, and a retry with the same key follows the same job.

A job that ends other than completed is an error in OpenAI's envelope: before the response
starts it is the response (409 cancelled, 502 failed, 503 expired); once a stream has started it
is a last ``data: {"error": …}`` event before ``[DONE]``, which OpenAI's SDKs raise as an error.

A job whose worker died runs again elsewhere. A waiting request answers with the new attempt's
text; a stream goes on if the new attempt repeats what was sent (continuity.py), and ends with an
error only if it writes other text.
"""

from __future__ import annotations

import io
import json
import logging
from typing import Any

from channels.exceptions import StopConsumer
from channels.generic.http import AsyncHttpConsumer
from django.conf import settings
from rest_framework import exceptions as drf_exceptions

from api.common.errors import JobNotFound, ServiceError, ServiceUnavailable, error_body
from api.common.exception_handler import exception_handler
from api.common.parsers import RequestTooLarge, StrictJSONParser
from api.jobs.logprobs import chat_logprobs, job_logprobs, text_logprobs
from api.jobs.services.submission import JobSubmission, job_create
from api.keys.authentication import authenticate_api_key
from api.models import ApiKey, Job
from api.openai_api.continuity import Diverged, StreamContinuity
from api.openai_api.requests import Kind, OpenAIRequest, openai_request
from api.openai_api.responses import ChunkWriter, StreamRestarted, completion_body, ending_error
from api.streaming.consumers import cancel_job, db_thread, scope_api_key
from api.streaming.follow import FollowsJob
from api.streaming.http_stream import HttpStreamMixin, encode_headers

logger = logging.getLogger(__name__)


class CompletionConsumer(HttpStreamMixin, FollowsJob, AsyncHttpConsumer):
    """Serves one request of ``kind`` (set by the route)."""

    kind: Kind = Kind.CHAT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._size = 0
        self._job_id: str | None = None
        self._api_key: ApiKey | None = None
        self._request: OpenAIRequest | None = None
        self._created = 0
        self._headers: dict[str, str] = {}
        self._cancel_on_disconnect = True
        self._writer: ChunkWriter | None = None
        self._continuity = StreamContinuity()

    # -- ASGI ---------------------------------------------------------------------------------

    async def http_request(self, message: dict[str, Any]) -> None:
        """Collect the body; once it is whole, submit the job. The consumer then stays alive until
        the job's final ends the response, or the client goes (``http.disconnect``)."""
        body = message.get("body", b"")
        self._size += len(body)
        if self._size > settings.MAX_REQUEST_BYTES:
            await self._reject_exception(RequestTooLarge(f"Request body larger than {settings.MAX_REQUEST_BYTES} bytes."))
            return
        self.body.append(body)
        if not message.get("more_body"):
            await self._open()

    async def disconnect(self) -> None:
        self.stop_keepalive()
        self.stop_following()
        if self._job_id is not None and not self._ended and self._cancel_on_disconnect:
            self._ended = True
            try:
                await cancel_job(self._api_key, self._job_id)
                logger.info("job %s cancelled: its client went away", self._job_id)
            except ServiceError:
                pass  # it finished meanwhile

    # -- the request --------------------------------------------------------------------------

    async def _open(self) -> None:
        if self.scope["method"] != "POST":
            await self._reject(ServiceError(f"Method \"{self.scope['method']}\" not allowed.",
                                            code="method_not_allowed"), status=405, headers={"Allow": "POST"})
            return
        idempotency_key = _header(self.scope, b"idempotency-key")
        try:
            self._api_key, self._request, submission = await _submit(
                self.kind, scope_api_key(self.scope), _header(self.scope, b"content-type"), b"".join(self.body),
                idempotency_key)
        except Exception as exc:  # mapped exactly as the REST API maps it
            await self._reject_exception(exc)
            return
        job = submission.job
        self._job_id = str(job.id)
        self._created = int(job.created_at.timestamp())
        self._cancel_on_disconnect = idempotency_key is None
        self._headers = {"x-job-id": self._job_id}
        rate = submission.rate_limit
        if rate is not None:
            self._headers.update(rate.headers())
        # The job exists now: even without Redis the answer comes, from its row once it ends.
        await self.open_relay(self._job_id, 0, self._on_message, look=False)
        if self._request.stream:
            await self._start_stream()
        self.follow()

    async def _start_stream(self) -> None:
        request = self._request
        assert request is not None and self._job_id is not None
        await self.send_headers(status=200, headers=encode_headers({
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            "x-accel-buffering": "no",  # nginx would otherwise hold the events back
            **self._headers,
        }))
        self._writer = ChunkWriter(kind=self.kind, job_id=self._job_id, created=self._created, model=request.model,
                                   include_usage=request.include_usage, tool_format=request.tool_format,
                                   tools_forced=request.tools_forced)
        opening = self._writer.opening()
        if opening is not None:
            await self._data(opening)
        if request.echo is not None:
            await self._data(self._writer.text(request.echo))  # type: ignore[arg-type]  # text: never held
        self.start_keepalive()

    async def _on_message(self, message: dict[str, Any]) -> None:
        """The relay's send: the job's deltas, a reset, then its final, exactly once and in order."""
        if self._ended:
            return
        kind = message["type"]
        if self._writer is None:
            if kind == "final":  # a restart needs nothing here: the answer is the row's text
                await self._answer(message)
            return
        try:
            if kind == "delta":
                text = self._continuity.text(message["text"])
                # After a restart a chunk may be sent only in part (continuity.py): its tokens'
                # log probabilities cannot be split with it, and are left out. A chunk with no
                # text but entries (the job's last tokens) still goes out, for them.
                logprobs = message.get("logprobs") if text == message["text"] else None
                chunk = self._writer.text(text, logprobs) if text or logprobs else None
                if chunk is not None:
                    await self._data(chunk)
            elif kind == "reset":  # the job starts again elsewhere: see continuity.py
                self._continuity.reset()
            elif kind == "final":
                self._continuity.end()
                await self._end_stream(ending_error(message), final=message)
        except Diverged:  # text already sent cannot be taken back; the job itself goes on
            self._cancel_on_disconnect = False
            await self._end_stream(StreamRestarted(str(self._job_id)))

    async def job_gone(self, exc: JobNotFound) -> None:
        await self._end_with(exc)

    async def relay_failed(self) -> None:
        await self._end_with(ServiceUnavailable("The job's stream failed; poll GET /api/v1/jobs/<id>."))

    async def _end_with(self, error: ServiceError) -> None:
        if self._ended:
            return
        if self._writer is None:
            await self._reject(error)
        else:
            await self._end_stream(error)

    async def _answer(self, final: dict[str, Any]) -> None:
        """The whole response of a request without ``stream``."""
        request = self._request
        assert request is not None and self._job_id is not None
        error = ending_error(final)
        if error is not None:
            await self._reject(error)
            return
        asked = request.job.sampling.get("logprobs") is not None
        try:
            text, entries = await _job_text(self._job_id, with_logprobs=asked)
        except ServiceError as exc:  # DatabaseUnavailable: the job is done, its text is not readable now
            await self._reject(exc)
            return
        logprobs = None
        if entries is not None:
            logprobs = chat_logprobs(entries) if self.kind is Kind.CHAT else text_logprobs(entries, text=text)
        body = completion_body(kind=self.kind, job_id=self._job_id, created=self._created, model=request.model,
                               text=(request.echo or "") + text, final=final, logprobs=logprobs,
                               tool_format=request.tool_format)
        await self.send_json(200, body, self._headers)

    async def _end_stream(self, error: ServiceError | None, *, final: dict[str, Any] | None = None) -> None:
        assert self._writer is not None
        if error is not None:
            await self._data(error_body(error.message, error_type=error.error_type, code=error.code, param=error.param))
        elif final is not None:
            for chunk in self._writer.closing(final):
                await self._data(chunk)
        self._ended = True
        await self.send_body(b"data: [DONE]\n\n", more_body=False)

    # -- output -------------------------------------------------------------------------------

    async def _data(self, payload: dict[str, Any]) -> None:
        await self.send_body(f"data: {json.dumps(payload)}\n\n".encode(), more_body=True)

    async def _reject_exception(self, exc: Exception) -> None:
        response = exception_handler(exc, {"view": self})
        assert response is not None  # the handler answers every exception
        # A 503 (the database or Redis down) is a condition to retry, not a bug to trace.
        if response.status_code >= 500 and response.status_code != 503:
            logger.error("%s failed", self.scope["path"], exc_info=exc)
        headers = {name: value for name, value in response.items() if name.lower() != "content-type"}
        await self.send_json(response.status_code, response.data, {**headers, **self._headers})
        await self._stop_unless_waiting()

    async def _reject(self, exc: ServiceError, *, status: int | None = None,
                      headers: dict[str, str] | None = None) -> None:
        await self.send_error(exc, status=status, headers={**(headers or {}), **self._headers})
        await self._stop_unless_waiting()

    async def _stop_unless_waiting(self) -> None:
        """Before a job exists nothing can come: the consumer is done. After, it ends with the
        client's ``http.disconnect`` that follows the response."""
        if self._job_id is None:
            await self.disconnect()
            raise StopConsumer()


class ChatCompletionConsumer(CompletionConsumer):
    kind = Kind.CHAT


class TextCompletionConsumer(CompletionConsumer):
    kind = Kind.TEXT


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")  # as Django decodes header bytes
    return None


@db_thread
def _submit(kind: Kind, raw_key: str | None, content_type: str | None, body: bytes,
            idempotency_key: str | None) -> tuple[ApiKey, OpenAIRequest, JobSubmission]:
    """Authenticate, parse, validate and create the job: one thread hop. Raises what the REST
    API's view would (AuthenticationFailed first, as DRF authenticates before it parses)."""
    api_key = authenticate_api_key(raw_key)
    media_type = (content_type or "application/json").split(";")[0].strip().lower()
    if media_type != "application/json":
        raise drf_exceptions.UnsupportedMediaType(media_type)
    data = StrictJSONParser().parse(io.BytesIO(body), "application/json", {"encoding": "utf-8"})
    request = openai_request(kind, data)
    try:
        submission = job_create(owner=api_key.owner, api_key=api_key, request=request.job,
                                idempotency_key=idempotency_key)
    except ServiceError as exc:
        if exc.param == "max_tokens":  # name the limit as the client sent it
            exc.param = request.max_tokens_param
            exc.message = exc.message.replace("max_tokens", request.max_tokens_param)
        raise
    return api_key, request, submission


@db_thread
def _job_text(job_id: str, *, with_logprobs: bool) -> tuple[str, list | None]:
    """The finished job's text and, when asked, its log probabilities rendered (job_logprobs's
    entries): as the database holds them (the row is the truth). Off the event loop: a long job's
    entries take a noticeable time to render."""
    if not with_logprobs:
        return Job.objects.values_list("output_text", flat=True).get(id=job_id), None
    text, stored, model = Job.objects.values_list("output_text", "logprobs", "model").get(id=job_id)
    return text, job_logprobs(stored or [], model=model)
