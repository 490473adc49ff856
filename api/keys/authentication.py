"""API-key authentication: ``Authorization: Bearer <key>`` for DRF, and a helper for consumers."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from api.common.errors import ApiKeyRevoked, AuthenticationFailed
from api.keys.selectors import api_key_with_owner, api_key_with_owner_and_job
from api.keys.services import api_key_touch, hash_secret
from api.models import ApiKey


def authenticate_api_key(raw: str | None) -> ApiKey:
    """The active key whose secret is ``raw`` (with its owner loaded), or AuthenticationFailed.

    Synchronous (ORM); a consumer calls it through ``database_sync_to_async``."""
    return _active(api_key_with_owner(hashed_key=hash_secret(_require(raw))))


def authenticate_api_key_for_job(raw: str | None, job_id: str) -> tuple[ApiKey, bool]:
    """:func:`authenticate_api_key`, and whether job ``job_id`` is the key owner's: one query."""
    api_key, owns = api_key_with_owner_and_job(hashed_key=hash_secret(_require(raw)), job_id=job_id)
    return _active(api_key), owns


def _require(raw: str | None) -> str:
    if not raw:
        raise AuthenticationFailed("Missing API key. Send 'Authorization: Bearer <key>'.", code="missing_api_key")
    return raw


def _active(api_key: ApiKey | None) -> ApiKey:
    if api_key is None or not api_key.owner.is_active:
        raise AuthenticationFailed("Invalid API key.", code="invalid_api_key")
    if api_key.revoked_at is not None:
        raise ApiKeyRevoked()
    api_key_touch(api_key=api_key)
    return api_key


def bearer_token(header: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, or None."""
    parts = header.split()
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return None
    return parts[1]


class ApiKeyAuthentication(BaseAuthentication):
    """DRF authentication: ``request.user`` is the key's owner, ``request.auth`` the ApiKey."""

    def authenticate(self, request: Request) -> tuple[Any, ApiKey] | None:
        try:
            header = get_authorization_header(request).decode("latin-1")
        except UnicodeDecodeError:
            header = ""
        if not header:
            return None  # DRF answers NotAuthenticated (401 via authenticate_header)
        token = bearer_token(header)
        if token is None:
            raise AuthenticationFailed("Malformed Authorization header; expected 'Bearer <key>'.")
        api_key = authenticate_api_key(token)
        return api_key.owner, api_key

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    """Describes the Bearer API key in the OpenAPI schema."""

    target_class = "api.keys.authentication.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "An API key: `Authorization: Bearer sk-…`"}
