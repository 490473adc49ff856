"""The channel-layer events of a job's group, handed to a consumer's relay.

Both job streams, the WebSocket (api/consumers.py) and server-sent events (api/sse.py), join the
group ``job.<id>`` and feed what it delivers to their :class:`JobStreamRelay`, which sends each
chunk exactly once, in order, whatever the transport.
"""

from __future__ import annotations

import logging
from typing import Any

from channels.consumer import get_handler_name
from redis.exceptions import RedisError

from api.keys import job_group_name
from api.streaming.group_batch import messages_for
from api.streaming.relay import JobStreamRelay

logger = logging.getLogger(__name__)

# What a client hears when the group cannot be joined: the job itself is safe in the database.
STREAM_UNAVAILABLE = "The job's stream is unavailable right now; poll GET /api/v1/jobs/<id> or retry."


class RelayEvents:
    """Mix into a Channels consumer (before the consumer class) that sets ``self.relay``."""

    relay: JobStreamRelay | None = None
    group: str | None = None
    channel_name: str
    channel_layer: Any

    async def join_job_group(self, job_id: str) -> bool:
        """Join ``job.<id>``, before the relay's replay (relay.py says why). False, logged, when
        Redis is down: there is no stream to follow."""
        group = job_group_name(job_id)
        try:
            await self.channel_layer.group_add(group, self.channel_name)
        except (RedisError, OSError):
            logger.warning("job %s: cannot join its group to stream it", job_id, exc_info=True)
            return False
        self.group = group
        return True

    async def leave_job_group(self) -> None:
        """Leave the group (if joined) and stop the relay's watchdog; safe to call twice."""
        if self.group is not None:
            group, self.group = self.group, None
            await self.channel_layer.group_discard(group, self.channel_name)
        if self.relay is not None:
            self.relay.close()

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Channels' dispatch, without its ``aclose_old_connections()`` before every message.
        That is a hop to the process's one sync thread per message, a live delta included, to
        close connections that thread never opens here: every DB call of these consumers runs
        through ``database_sync_to_async``, which closes its own thread's connections."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def job_batch(self, event: dict[str, Any]) -> None:
        """Several events at once, for the consumers of this process (group_batch.py)."""
        for message in messages_for(self.channel_name, event):
            await self.dispatch(message)

    async def job_delta(self, event: dict[str, Any]) -> None:
        if self.relay is not None:
            await self.relay.on_delta(int(event["seq"]), event["text"], event.get("completion_tokens"),
                                      event.get("logprobs"))

    async def job_final(self, event: dict[str, Any]) -> None:
        if self.relay is not None:
            await self.relay.on_final(event["message"])

    async def job_reset(self, event: dict[str, Any]) -> None:
        if self.relay is not None:
            await self.relay.on_reset()
