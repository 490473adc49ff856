"""An API key's revocation, heard at once by the job streams the key opened.

A job's WebSocket or event stream (SSE) outlives the request that authenticated it, and can follow
any of the owner's jobs. So each joins its key's channel-layer group (``apikey.<hash>``, see
api/keys.py) *before* its key is read: a revocation committed after that read is announced to a
group it is already in. :func:`api_key_revocation_announce` (the revoke service calls it once the
revocation commits) tells every such connection, in every web process; each ends with the
``revoked_api_key`` error (close code 4401 on a WebSocket, an ``error`` event on a stream). The jobs
themselves run on: the owner's other keys still reach them.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from redis.exceptions import RedisError

from api.keys import api_key_group_name
from api.services.api_keys import hash_secret

logger = logging.getLogger(__name__)

EVENT_REVOKED = "api_key.revoked"


def api_key_revocation_announce(*, hashed_key: str) -> None:
    """Tell the connections authenticated by the key with this stored hash that it is revoked.
    Best effort: with Redis down there are no streams to end (they need Redis), and every new
    request is refused by the database row anyway."""
    try:
        async_to_sync(get_channel_layer().group_send)(api_key_group_name(hashed_key), {"type": EVENT_REVOKED})
    except (RedisError, OSError, TimeoutError):
        logger.warning("Could not announce a key's revocation to its open streams", exc_info=True)


class KeyRevocationEvents:
    """Mix into a Channels consumer (before the consumer class) that authenticates with an API key
    and implements :meth:`key_revoked`."""

    key_group: str | None = None
    channel_name: str
    channel_layer: Any

    async def join_key_group(self, raw_key: str | None) -> None:
        """Join the group of the key whose secret is ``raw_key``; call it before reading the key.
        Without Redis it logs and goes on: the connection then learns of a revocation only at its
        next request (a submission, a cancel), which reads the key again."""
        if not raw_key:
            return
        group = api_key_group_name(hash_secret(raw_key))
        try:
            await self.channel_layer.group_add(group, self.channel_name)
        except (RedisError, OSError):
            logger.warning("Cannot join a key's group: its revocation will not end this stream", exc_info=True)
            return
        self.key_group = group

    async def leave_key_group(self) -> None:
        if self.key_group is not None:
            group, self.key_group = self.key_group, None
            try:
                await self.channel_layer.group_discard(group, self.channel_name)
            except (RedisError, OSError):
                logger.warning("Cannot leave a key's group (its entry expires by itself)", exc_info=True)

    async def api_key_revoked(self, event: dict[str, Any]) -> None:
        await self.key_revoked()

    async def key_revoked(self) -> None:
        """End what the connection streams, with the ``revoked_api_key`` error."""
        raise NotImplementedError
