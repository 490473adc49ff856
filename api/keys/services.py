"""API keys: creation (the secret is returned once), revocation (announced to the job streams the
key opened, api/keys/revocation.py), last-used bookkeeping, and the rotation of the secret that
signs the key's webhooks (made with the key, api/keys/models.py)."""

from __future__ import annotations

import hashlib
import logging
import secrets
from datetime import timedelta

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone
from redis.exceptions import RedisError

from api.common.redis_keys import api_key_group_name
from api.keys.selectors import api_key_get
from api.models import ApiKey, new_webhook_secret

logger = logging.getLogger(__name__)

SECRET_PREFIX = "sk-"
VISIBLE_PREFIX_LENGTH = 12
# last_used_at is a hint for operators, not an audit log: write it at most once a minute per key
# so polling clients do not turn every GET into a row update.
TOUCH_INTERVAL = timedelta(seconds=60)
# The channel-layer message a revocation sends; KeyRevocationEvents.api_key_revoked handles it.
EVENT_REVOKED = "api_key.revoked"


def hash_secret(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def api_key_create(
    *,
    owner: User,
    name: str = "",
    requests_per_minute: int | None = None,
    tokens_per_day: int | None = None,
    max_concurrent_jobs: int | None = None,
    max_tokens_per_job: int | None = None,
    priority: int | None = None,
) -> tuple[ApiKey, str]:
    """Create a key for ``owner``. Returns the key and its secret; the secret is not stored and
    cannot be shown again. Quotas left as None take the settings' defaults. The key's webhook
    signing secret (``api_key.webhook_secret``) is made with it: show it with the key, once."""
    raw = api_key_generate_secret()
    quotas = {
        "requests_per_minute": requests_per_minute,
        "tokens_per_day": tokens_per_day,
        "max_concurrent_jobs": max_concurrent_jobs,
        "max_tokens_per_job": max_tokens_per_job,
        "priority": priority,
    }
    api_key = ApiKey(owner=owner, name=name, **{k: v for k, v in quotas.items() if v is not None})
    api_key_set_secret(api_key=api_key, raw=raw)
    api_key.full_clean()
    api_key.save()
    return api_key, raw


def api_key_replace(*, owner: User, name: str) -> tuple[ApiKey, str]:
    """A new key named ``name`` for ``owner``, whose earlier valid keys of that name are revoked in
    the same transaction: one valid key of that name at a time (``make run``'s demo key, minted
    at every start). Returns the new key and its secret."""
    with transaction.atomic():
        for api_key_id in ApiKey.objects.filter(owner=owner, name=name, revoked_at__isnull=True).values_list(
                "id", flat=True):
            api_key_revoke(api_key_id=api_key_id)
        return api_key_create(owner=owner, name=name)


def api_key_set_secret(*, api_key: ApiKey, raw: str) -> None:
    """Fill the stored hash and visible prefix of an unsaved key (used by the admin's add form)."""
    api_key.prefix = raw[:VISIBLE_PREFIX_LENGTH]
    api_key.hashed_key = hash_secret(raw)


def api_key_generate_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def api_key_revoke(*, api_key_id: int) -> bool:
    """Revoke a key; returns False if it was already revoked. Takes effect on the next request, and
    once the revocation commits, the job streams the key opened end (api/keys/revocation.py)."""
    updated = ApiKey.objects.filter(id=api_key_id, revoked_at__isnull=True).update(revoked_at=timezone.now())
    if updated != 1:
        return False
    hashed_key = ApiKey.objects.values_list("hashed_key", flat=True).get(id=api_key_id)
    transaction.on_commit(lambda: api_key_revocation_announce(hashed_key=hashed_key))
    return True


def api_key_revocation_announce(*, hashed_key: str) -> None:
    """Tell the connections authenticated by the key with this stored hash that it is revoked.
    Best effort: with Redis down there are no streams to end (they need Redis), and every new
    request is refused by the database row anyway."""
    try:
        async_to_sync(get_channel_layer().group_send)(api_key_group_name(hashed_key), {"type": EVENT_REVOKED})
    except (RedisError, OSError, TimeoutError):
        logger.warning("Could not announce a key's revocation to its open streams", exc_info=True)


def api_key_revoke_owned(*, key_id: int, owner: User) -> ApiKey:
    """Revoke ``owner``'s key ``key_id`` (ApiKeyNotFound for anyone else's) and return it as
    stored. Revoking a revoked key changes nothing: its first revocation time stays."""
    api_key = api_key_get(key_id=key_id, owner=owner)
    api_key_revoke(api_key_id=api_key.id)
    api_key.refresh_from_db(fields=["revoked_at"])
    return api_key


def api_key_touch(*, api_key: ApiKey) -> None:
    """Record that the key was just used (at most one write per key per TOUCH_INTERVAL)."""
    now = timezone.now()
    if api_key.last_used_at is not None and now - api_key.last_used_at < TOUCH_INTERVAL:
        return
    ApiKey.objects.filter(id=api_key.id).update(last_used_at=now)
    api_key.last_used_at = now


def api_key_rotate_webhook_secret(*, api_key_id: int) -> str:
    """Give the key a new webhook signing secret and return it (shown once). Deliveries still
    pending are signed with it from their next attempt."""
    secret = new_webhook_secret()
    ApiKey.objects.filter(id=api_key_id).update(webhook_secret=secret)
    return secret


def api_key_rotate_webhook_secret_owned(*, key_id: int, owner: User) -> tuple[ApiKey, str]:
    """:func:`api_key_rotate_webhook_secret` of ``owner``'s key ``key_id`` (ApiKeyNotFound for
    anyone else's); returns the key and its new secret."""
    api_key = api_key_get(key_id=key_id, owner=owner)
    return api_key, api_key_rotate_webhook_secret(api_key_id=api_key.id)
