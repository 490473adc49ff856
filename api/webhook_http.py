"""One webhook request: resolve and check the host again, POST to the checked address, never
follow a redirect, wait at most WEBHOOK_TIMEOUT_S for each step, keep the start of the answer.

The request goes to the address :func:`api.webhook_urls.webhook_target` checked, with the URL's
host in ``Host`` and, over TLS, as the server name (SNI and the certificate's check): a second
lookup by the HTTP client could return another address. Proxies from the environment are not
used for the same reason.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from api.webhook_urls import WebhookUrlRefused, webhook_target

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


def webhook_post(*, url: str, body: str, headers: dict[str, str], timeout_s: float) -> WebhookResponse:
    """POST ``body`` to ``url``. Never raises for what the network or the receiver does."""
    started = time.monotonic()

    def answer(status_code: int | None, error: str = "", excerpt: str = "") -> WebhookResponse:
        return WebhookResponse(status_code, error, excerpt, round((time.monotonic() - started) * 1000.0, 3))

    try:
        target = webhook_target(url)
    except WebhookUrlRefused as exc:
        return answer(None, f"refused: {exc.reason}")
    host = target.url.raw_host.decode("ascii")
    extensions = {"sni_hostname": host} if target.url.scheme == "https" else {}
    try:
        with httpx.Client(timeout=timeout_s, follow_redirects=False, trust_env=False) as client, client.stream(
            "POST", target.pinned_url, content=body.encode("utf-8"), extensions=extensions,
            headers={**headers, "host": target.host_header, "user-agent": USER_AGENT},
        ) as response:
            return answer(response.status_code, excerpt=_excerpt(response))
    except httpx.HTTPError as exc:
        return answer(None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


def _excerpt(response: httpx.Response) -> str:
    data = b""
    for chunk in response.iter_bytes():
        data += chunk
        if len(data) >= RESPONSE_EXCERPT_BYTES:
            break
    return data[:RESPONSE_EXCERPT_BYTES].decode("utf-8", errors="replace")
