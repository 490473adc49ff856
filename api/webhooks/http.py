"""One webhook request: resolve and check the host again, POST to the checked address, never
follow a redirect, give it WEBHOOK_CONNECT_TIMEOUT_S to connect and at most WEBHOOK_TIMEOUT_S in
all, keep the start of the answer.

The request goes to the address :func:`api.webhooks.targets.webhook_target` checked, with the URL's
host in ``Host`` and, over TLS, as the server name (SNI and the certificate's check): a second
lookup by the HTTP client could return another address. Proxies from the environment are not
used for the same reason.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx

from api.webhooks.targets import WebhookTarget, WebhookUrlRefused, webhook_target

USER_AGENT = "inference-service-webhooks/1"
# Enough of a refusal's body for an operator to read why; the rest is never downloaded.
RESPONSE_EXCERPT_BYTES = 1024


@dataclass(frozen=True)
class WebhookResponse:
    """What one attempt got: a status code, or an error that says why there was none."""

    status_code: int | None
    error: str
    excerpt: str
    duration_ms: float

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def webhook_post(*, url: str, body: str, headers: dict[str, str], timeout_s: float,
                 connect_timeout_s: float | None = None) -> WebhookResponse:
    """POST ``body`` to ``url``, in at most ``timeout_s`` from the connection to the last byte
    read (after the host's lookup, which the system resolver bounds), with at most
    ``connect_timeout_s`` of it to connect. Never raises for what the network or the receiver does."""
    started = time.monotonic()

    def answer(status_code: int | None, error: str = "", excerpt: str = "") -> WebhookResponse:
        return WebhookResponse(status_code, error, excerpt, round((time.monotonic() - started) * 1000.0, 3))

    try:
        target = webhook_target(url)
    except WebhookUrlRefused as exc:
        return answer(None, f"refused: {exc.reason}")
    try:
        timeouts = httpx.Timeout(timeout_s, connect=min(timeout_s, connect_timeout_s or timeout_s))
        status_code, excerpt = asyncio.run(_post(target, body, headers, timeouts))
    except TimeoutError:
        return answer(None, f"Timeout: no complete answer within {timeout_s:g} s")
    except httpx.HTTPError as exc:
        return answer(None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    return answer(status_code, excerpt=excerpt)


async def _post(target: WebhookTarget, body: str, headers: dict[str, str], timeouts: httpx.Timeout,
                ) -> tuple[int, str]:
    """The request, under one deadline for all of it: httpx's own timeouts apply to each read and
    write, so a receiver that sends its answer a byte at a time would hold a webhooks worker's slot
    for as long as it liked."""
    host = target.url.raw_host.decode("ascii")
    extensions = {"sni_hostname": host} if target.url.scheme == "https" else {}
    async with asyncio.timeout(timeouts.read), httpx.AsyncClient(timeout=timeouts, follow_redirects=False,
                                                             trust_env=False) as client:
        async with client.stream("POST", target.pinned_url, content=body.encode("utf-8"), extensions=extensions,
                                 headers={**headers, "host": target.host_header, "user-agent": USER_AGENT},
                                 ) as response:
            data = b""
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) >= RESPONSE_EXCERPT_BYTES:
                    break
            return response.status_code, data[:RESPONSE_EXCERPT_BYTES].decode("utf-8", errors="replace")
