"""Which webhook URLs the service calls: http(s) only, and only hosts on the public internet.

A URL is checked when a job (or a batch) names it, and its host is resolved again at every
attempt, whose request then goes to the very address checked (api/webhooks/http.py): a name that
resolved to a public address at submission and to 10.0.0.5 or 169.254.169.254 later (DNS
rebinding) is refused then. Private, loopback, link-local, multicast, reserved and unspecified
addresses are refused unless the operator allows them: WEBHOOK_ALLOW_PRIVATE (all of them, for a
trusted network) or WEBHOOK_ALLOWED_NETWORKS (these CIDRs).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

import httpx
from django.conf import settings

from api.common.errors import ServiceError

MAX_WEBHOOK_URL_LENGTH = 2048
SCHEMES = ("http", "https")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class WebhookUrlRefused(ServiceError):
    """A webhook URL the service will not call (a 400 with code ``invalid_webhook_url``)."""

    code = "invalid_webhook_url"

    def __init__(self, reason: str, *, param: str = "webhook_url") -> None:
        self.reason = reason
        super().__init__(f"{param}: {reason}", param=param)


@dataclass(frozen=True)
class WebhookTarget:
    """A checked URL and the address its request goes to."""

    url: httpx.URL
    address: IPAddress

    @property
    def pinned_url(self) -> httpx.URL:
        """The URL with the checked address as its host: the request never resolves the name again."""
        return self.url.copy_with(host=str(self.address))

    @property
    def host_header(self) -> str:
        host = self.url.raw_host.decode("ascii")
        default_port = {"http": 80, "https": 443}[self.url.scheme]
        return host if self.url.port in (None, default_port) else f"{host}:{self.url.port}"


def webhook_url_check(url: str, *, param: str = "webhook_url") -> str:
    """``url`` if the service may call it, else WebhookUrlRefused naming ``param``. Resolves the
    host (a blocking DNS lookup)."""
    webhook_target(url, param=param)
    return url


def webhook_target(url: str, *, param: str = "webhook_url") -> WebhookTarget:
    """Parse ``url``, resolve its host and check every address it resolves to; the target is the
    first. Raises WebhookUrlRefused."""
    parsed = _parse(url, param)
    host = parsed.raw_host.decode("ascii")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    addresses = _resolve(host, port, param)
    for address in addresses:
        if not address_allowed(address):
            raise WebhookUrlRefused(
                f"{host} resolves to {address}, a private or reserved address, which webhooks may not call.",
                param=param)
    return WebhookTarget(url=parsed, address=addresses[0])


def address_allowed(address: IPAddress) -> bool:
    """Whether a webhook may be sent to ``address`` under the operator's settings."""
    if settings.WEBHOOK_ALLOW_PRIVATE or any(address in network for network in settings.WEBHOOK_ALLOWED_NETWORKS):
        return True
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    # is_global alone lets multicast (224.0.0.0/4) through.
    return address.is_global and not (address.is_multicast or address.is_reserved or address.is_unspecified)


def _parse(url: str, param: str) -> httpx.URL:
    if not isinstance(url, str) or not url or len(url) > MAX_WEBHOOK_URL_LENGTH:
        raise WebhookUrlRefused(f"must be a URL of 1 to {MAX_WEBHOOK_URL_LENGTH} characters.", param=param)
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, UnicodeError):
        raise WebhookUrlRefused("is not a valid URL.", param=param) from None
    if parsed.scheme not in SCHEMES:
        raise WebhookUrlRefused("must be an http:// or https:// URL.", param=param)
    if not parsed.raw_host:
        raise WebhookUrlRefused("has no host.", param=param)
    if parsed.userinfo:
        # The signature authenticates the service to the receiver; credentials in a URL would be
        # stored with the job and shown back with it.
        raise WebhookUrlRefused("must not carry a user name or password.", param=param)
    if parsed.fragment:
        raise WebhookUrlRefused("must not have a fragment (#...).", param=param)
    return parsed


def _resolve(host: str, port: int, param: str) -> list[IPAddress]:
    try:
        literal = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    else:
        return [literal]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise WebhookUrlRefused(f"the host {host} could not be resolved.", param=param) from None
    addresses = list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos))
    if not addresses:
        raise WebhookUrlRefused(f"the host {host} could not be resolved.", param=param)
    return addresses
