"""``POST /api/v1/jobs`` in one hop: the submission served beside Django's request cycle.

A burst of submissions is the service's hottest path, and each web process serves its share of a
burst one request thread at a time. Through Django and DRF a submission paid for the
``ASGIRequest``, the seven middleware, URL resolution and DRF's dispatch (content negotiation,
the ``Request`` wrapper, permissions, the response's rendering and finalizing) on top of the
service's own work: the key lookup, the serializer and ``job_create``. This route runs the same
service code (the key's authentication, ``StrictJSONParser``, ``job_submit`` with its serializer,
the error envelope of ``api.errors``) straight from the ASGI scope, on the request threads of
``OneHopASGIHandler``, and answers with the same status, body and headers, including those the
middleware adds to an API response (a test compares both paths, request by request).

It takes only the plain case: ``Content-Type: application/json`` (UTF-8), an ``Accept`` that the
JSON renderer satisfies as is, an ``Authorization`` header, no repeated header, and a body within
``MAX_REQUEST_BYTES``. Anything else (a missing key, another media type, ``Accept: text/html``,
an oversized body) goes to Django unchanged, with the body read so far replayed, so its answer is
DRF's by construction. With a middleware list other than the one this route mirrors, or with
HTTPS redirects or HSTS configured, the route stays off and Django serves every submission.
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Executor
from http import HTTPStatus
from typing import Any

from django.conf import settings
from django.core import signals
from django.http.request import split_domain_port, validate_host
from rest_framework.renderers import JSONRenderer

from api.authentication import authenticate_authorization_header
from api.errors import exception_handler
from api.parsers import StrictJSONParser
from api.views.jobs import job_submit

logger = logging.getLogger(__name__)
request_logger = logging.getLogger("django.request")

PATH = "/api/v1/jobs"
# The middleware whose effect on an API response the route reproduces (_middleware_headers). Of
# them only SecurityMiddleware and XFrameOptionsMiddleware touch such a response: the view is
# CSRF-exempt and token-authenticated, and nothing reads the session, the user or messages.
MIRRORED_MIDDLEWARE = (
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
)
JSON_TYPES = frozenset({b"application/json", b"application/json;charset=utf-8"})
PLAIN_ACCEPTS = frozenset({b"*/*", b"application/json"})
# DRF's APIView answers with its allowed methods (finalize_response); the view has get and post.
ALLOW = b"GET, POST, HEAD, OPTIONS"

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class SubmitRoute:
    """ASGI app: ``POST /api/v1/jobs`` in one hop on ``executor``, everything else to ``app``."""

    def __init__(self, app: ASGIApp, *, executor: Executor) -> None:
        self.app = app
        self.executor = executor
        self.enabled = route_allowed()
        if not self.enabled:
            logger.info("POST %s goes through Django: the settings differ from those the route mirrors", PATH)
        self._static_headers = _middleware_headers()
        self._renderer = JSONRenderer()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not (self.enabled and scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == PATH
                and not scope.get("query_string") and not scope.get("root_path")):
            return await self.app(scope, receive, send)
        headers = _plain_headers(scope["headers"])
        if headers is None:
            return await self.app(scope, receive, send)
        body, messages, complete = await _read_body(receive, settings.MAX_REQUEST_BYTES)
        if body is None:
            return  # the client went away
        if not complete:  # over the limit: Django (DRF's parser) answers, after authentication
            return await self.app(scope, _replay(messages, receive), send)
        loop = asyncio.get_running_loop()
        status, response_headers, payload = await loop.run_in_executor(
            self.executor, self._respond, scope, headers, body
        )
        await send({"type": "http.response.start", "status": status, "headers": response_headers})
        await send({"type": "http.response.body", "body": payload})

    def _respond(self, scope: Scope, headers: dict[bytes, bytes], body: bytes) -> tuple[int, list, bytes]:
        """The sync part, on a request thread: Django's request signals around the submission
        (the thread's database connections are checked and returned as for any request)."""
        signals.request_started.send(sender=self.__class__, scope=scope)
        try:
            return self._submit(headers, body)
        finally:
            signals.request_finished.send(sender=self.__class__)

    def _submit(self, headers: dict[bytes, bytes], body: bytes) -> tuple[int, list, bytes]:
        idempotency_key = headers.get(b"idempotency-key")
        try:
            api_key = authenticate_authorization_header(headers[b"authorization"].decode("latin-1"))
            # As DRF's Request.data: an empty body is an empty form, never parsed.
            data = StrictJSONParser().parse(io.BytesIO(body), parser_context={"encoding": "utf-8"}) if body else {}
            status, content, extra = job_submit(
                api_key=api_key, data=data,
                idempotency_key=None if idempotency_key is None else idempotency_key.decode("latin-1"),
            )
        except Exception as exc:  # noqa: BLE001 - the envelope handler decides, as DRF's dispatch does
            error = exception_handler(exc, {"view": self})
            status, content, extra = error.status_code, error.data, dict(error.items())
            # As Django's handler logs every 4xx and 5xx answer.
            request_logger.log(logging.ERROR if status >= 500 else logging.WARNING, "%s: %s",
                               HTTPStatus(status).phrase, PATH, extra={"status_code": status})
        payload = self._renderer.render(content)
        response_headers = [(b"content-type", b"application/json")]
        response_headers += [(name.encode("latin-1"), value.encode("latin-1")) for name, value in extra.items()
                             if name.lower() != "content-type"]
        response_headers.append((b"allow", ALLOW))
        response_headers += self._static_headers
        response_headers.append((b"content-length", str(len(payload)).encode()))
        return status, response_headers, payload


def route_allowed() -> bool:
    """Whether the route reproduces what Django would answer under these settings."""
    return (
        tuple(settings.MIDDLEWARE) == MIRRORED_MIDDLEWARE
        and not settings.SECURE_SSL_REDIRECT
        and not settings.SECURE_HSTS_SECONDS
        and not settings.DISALLOWED_USER_AGENTS
        and not settings.PREPEND_WWW
        and settings.REST_FRAMEWORK.get("DEFAULT_RENDERER_CLASSES") == ["rest_framework.renderers.JSONRenderer"]
        and settings.REST_FRAMEWORK.get("DEFAULT_PARSER_CLASSES") == ["api.parsers.StrictJSONParser"]
        and not settings.REST_FRAMEWORK.get("DEFAULT_THROTTLE_CLASSES")
    )


def _middleware_headers() -> list[tuple[bytes, bytes]]:
    """What SecurityMiddleware and XFrameOptionsMiddleware add to a plain-HTTP API response."""
    headers = []
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        headers.append((b"x-content-type-options", b"nosniff"))
    if settings.SECURE_REFERRER_POLICY:
        policy = settings.SECURE_REFERRER_POLICY
        value = ",".join(v.strip() for v in policy.split(",")) if isinstance(policy, str) else ",".join(policy)
        headers.append((b"referrer-policy", value.encode()))
    if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
        headers.append((b"cross-origin-opener-policy", settings.SECURE_CROSS_ORIGIN_OPENER_POLICY.encode()))
    headers.append((b"x-frame-options", getattr(settings, "X_FRAME_OPTIONS", "DENY").upper().encode()))
    return headers


def _plain_headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[bytes, bytes] | None:
    """The request's headers by lower-case name, or None unless the request is the plain case."""
    headers: dict[bytes, bytes] = {}
    for name, value in raw:
        name = name.lower()
        if name in headers:
            return None  # Django joins repeated headers; leave that to it
        headers[name] = value
    content_type = headers.get(b"content-type", b"").replace(b" ", b"").lower()
    if content_type not in JSON_TYPES or b"authorization" not in headers or b"cookie" in headers:
        return None  # no key: DRF's 401; a cookie: the session and messages middleware may answer
    if headers.get(b"accept", b"*/*").strip().lower() not in PLAIN_ACCEPTS:
        return None
    if not headers.get(b"content-length", b"").isdigit():
        return None  # DRF decides from Content-Length alone whether there is a body
    if not _host_allowed(headers):
        return None  # CommonMiddleware's get_host() answers 400
    return headers


def _host_allowed(headers: dict[bytes, bytes]) -> bool:
    """HttpRequest.get_host()'s check, for a request with a Host header and no forwarded host."""
    if b"host" not in headers or (settings.USE_X_FORWARDED_HOST and b"x-forwarded-host" in headers):
        return False
    domain, _port = split_domain_port(headers[b"host"].decode("latin-1"))
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return bool(domain) and validate_host(domain, allowed)


async def _read_body(receive: Receive, limit: int) -> tuple[bytes | None, list[dict], bool]:
    """(body, the messages read, whether the body is complete within ``limit``); body None when
    the client disconnected."""
    messages: list[dict] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None, messages, False
        messages.append(message)
        size += len(message.get("body", b""))
        if size > limit:
            return b"", messages, False
        if not message.get("more_body", False):
            return b"".join(m.get("body", b"") for m in messages), messages, True


def _replay(messages: list[dict], receive: Receive) -> Receive:
    """A ``receive`` that gives ``messages`` again before reading on."""
    pending = list(messages)

    async def replayed() -> dict[str, Any]:
        return pending.pop(0) if pending else await receive()

    return replayed

