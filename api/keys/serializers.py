"""/api/v1/keys: its query, and its answers: a user's own API keys (never their secrets or hashes)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from api.models import ApiKey


class KeyQuotasSerializer(serializers.Serializer):
    requests_per_minute = serializers.IntegerField()
    tokens_per_day = serializers.IntegerField()
    max_concurrent_jobs = serializers.IntegerField()
    max_tokens_per_job = serializers.IntegerField()
    priority = serializers.IntegerField(help_text="The key's priority class (lower is more urgent)")


class ApiKeySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    object = serializers.CharField()
    prefix = serializers.CharField(help_text="The secret's first characters, to tell keys apart")
    name = serializers.CharField()
    created_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(allow_null=True, help_text="Updated at most once a minute")
    revoked_at = serializers.DateTimeField(allow_null=True)
    active = serializers.BooleanField()
    current = serializers.BooleanField(help_text="Whether this is the key of the request")
    quotas = KeyQuotasSerializer()


def api_key_body(api_key: ApiKey, *, current: ApiKey) -> dict[str, Any]:
    """The fields of :class:`ApiKeySerializer` for ``api_key``, ``current`` being the request's key."""
    return {
        "id": api_key.id,
        "object": "api_key",
        "prefix": api_key.prefix,
        "name": api_key.name,
        "created_at": api_key.created_at,
        "last_used_at": api_key.last_used_at,
        "revoked_at": api_key.revoked_at,
        "active": api_key.is_active,
        "current": api_key.id == current.id,
        "quotas": api_key,
    }


class WebhookSecretSerializer(serializers.Serializer):
    object = serializers.CharField(default="webhook_secret")
    api_key_id = serializers.IntegerField()
    secret = serializers.CharField(help_text="whsec_<base64>: verifies the key's webhooks; shown once")


KEYS_MAX_PAGE_SIZE = 50


class KeyListQuerySerializer(serializers.Serializer):
    """GET /keys's query: bad paging is a 400 that names it, as for GET /jobs."""

    page = serializers.IntegerField(min_value=1, required=False)
    page_size = serializers.IntegerField(min_value=1, max_value=KEYS_MAX_PAGE_SIZE, required=False)
