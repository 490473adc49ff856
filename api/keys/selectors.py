"""Reads of API keys: the key behind a secret's hash, with its owner (the authentication path),
and a user's own keys (``/api/v1/keys``)."""

from __future__ import annotations

import uuid

from django.contrib.auth.models import User
from django.db.models import Exists, OuterRef, QuerySet

from api.common.errors import ApiKeyNotFound
from api.models import ApiKey, Job


def api_key_with_owner(*, hashed_key: str) -> ApiKey | None:
    """The key whose secret hashes to ``hashed_key``, with ``owner`` loaded, or None."""
    return ApiKey.objects.select_related("owner").filter(hashed_key=hashed_key).first()


def api_key_with_owner_and_job(*, hashed_key: str, job_id: str) -> tuple[ApiKey | None, bool]:
    """:func:`api_key_with_owner`, and whether job ``job_id`` belongs to the key's owner (False
    for a key that is not found, an id that is not a job's, or a job its owner deleted), in one
    query: a job's WebSocket and event stream ask both when they connect."""
    try:
        job_pk = uuid.UUID(str(job_id))
    except ValueError:  # not a UUID: no job has it
        return api_key_with_owner(hashed_key=hashed_key), False
    owns_job = Exists(Job.objects.filter(id=job_pk, owner=OuterRef("owner"), deleted_at__isnull=True))
    api_key = (ApiKey.objects.select_related("owner").annotate(owns_job=owns_job)
               .filter(hashed_key=hashed_key).first())
    return (None, False) if api_key is None else (api_key, api_key.owns_job)


def api_key_list(*, owner: User) -> QuerySet[ApiKey]:
    """``owner``'s keys, revoked ones included, newest first."""
    return ApiKey.objects.filter(owner=owner).order_by("-created_at", "-id")


def api_key_get(*, key_id: int, owner: User) -> ApiKey:
    """``owner``'s key ``key_id``, or ApiKeyNotFound (another user's key is not found either)."""
    try:
        return ApiKey.objects.get(id=key_id, owner=owner)
    except ApiKey.DoesNotExist:
        raise ApiKeyNotFound(key_id) from None
