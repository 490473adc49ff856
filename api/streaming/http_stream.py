"""What the long-lived HTTP responses share: the job event stream (api/streaming/sse.py) and OpenAI's
completions (api/openai_api/consumer.py), both Channels ``AsyncHttpConsumer`` s that answer for as
long as a job runs."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from django.conf import settings

from api.common.errors import ServiceError, error_body


class HttpStreamMixin:
    """Mix into an ``AsyncHttpConsumer`` (before it in the bases). ``_ended`` is set once the
    response is complete; nothing is sent after it."""

    if TYPE_CHECKING:  # AsyncHttpConsumer's (channels ships no types)
        async def send_body(self, body: bytes, *, more_body: bool = False) -> None: ...

        async def send_response(self, status: int, body: bytes, **kwargs: Any) -> None: ...

    _ended = False
    _keepalive: asyncio.Task[None] | None = None

    def start_keepalive(self) -> None:
        """A comment line every ``SSE_KEEPALIVE_S`` seconds keeps idle connections open through
        proxies, until the response ends."""
        self._keepalive = asyncio.get_running_loop().create_task(self._keep_alive())

    def stop_keepalive(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()

    async def _keep_alive(self) -> None:
        interval = settings.SSE_KEEPALIVE_S
        while not self._ended:
            await asyncio.sleep(interval)
            if not self._ended:
                await self.send_body(b": keep-alive\n\n", more_body=True)

    async def send_error(self, exc: ServiceError, *, status: int | None = None,
                         headers: dict[str, str] | None = None) -> None:
        """``exc`` as the whole response, in the error envelope."""
        body = error_body(exc.message, error_type=exc.error_type, code=exc.code, param=exc.param)
        await self.send_json(status or exc.status_code, body, {**exc.headers(), **(headers or {})})

    async def send_json(self, status: int, body: Any, headers: dict[str, str]) -> None:
        """A whole JSON response (header names are sent lower-case, as HTTP/2 wants them)."""
        self._ended = True
        all_headers = {**{name.lower(): value for name, value in headers.items()}, "content-type": "application/json"}
        await self.send_response(status, json.dumps(body).encode(),
                                 headers=encode_headers(all_headers))


def encode_headers(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
