"""An API key's revocation, heard at once by the job streams the key opened.

A job's WebSocket or event stream (SSE) outlives the request that authenticated it, and can follow
any of the owner's jobs. So each joins its key's channel-layer group (``apikey.<hash>``, see
api/common/redis_keys.py) *before* its key is read: a revocation committed after that read is announced to a
group it is already in. The announcement
(:func:`api.keys.services.api_key_revocation_announce`, sent once the revocation commits)
reaches every such connection, in every web process; each ends with the ``revoked_api_key`` error
(close code 4401 on a WebSocket, an ``error`` event on a stream). The jobs themselves run on: the
owner's other keys still reach them.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import RedisError

from api.common.redis_keys import api_key_group_name
from api.keys.services import hash_secret

logger = logging.getLogger(__name__)


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

    async def api_key_revoked(self, event: dict[str, Any]) -> None:  # api_keys.EVENT_REVOKED
        await self.key_revoked()

    async def key_revoked(self) -> None:
        """End what the connection streams, with the ``revoked_api_key`` error."""
        raise NotImplementedError
