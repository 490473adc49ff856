"""Reads of a user's own API keys, for ``/api/v1/keys`` (the authentication path's key lookup is
selectors/api_keys.py)."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from api.common.errors import ApiKeyNotFound
from api.models import ApiKey


def api_key_list(*, owner: AbstractBaseUser) -> QuerySet[ApiKey]:
    """``owner``'s keys, revoked ones included, newest first."""
    return ApiKey.objects.filter(owner=owner).order_by("-created_at", "-id")


def api_key_get(*, key_id: int, owner: AbstractBaseUser) -> ApiKey:
    """``owner``'s key ``key_id``, or ApiKeyNotFound (another user's key is not found either)."""
    try:
        return ApiKey.objects.get(id=key_id, owner=owner)
    except ApiKey.DoesNotExist:
        raise ApiKeyNotFound(key_id) from None
