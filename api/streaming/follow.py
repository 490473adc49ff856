"""A consumer that follows one job's stream: its relay runs as a task of the consumer.

The WebSocket (api/streaming/consumers.py), server-sent events (api/streaming/sse.py) and OpenAI's completions
(api/openai_api/consumer.py) all mix this in. ``open_relay`` looks at the stream first (so a
consumer can still refuse with a clear error when Redis is down, before it promises a stream),
``follow`` runs the relay until the job's final has been sent, and ``stop_following`` (from
``disconnect``) cancels it.
"""

from __future__ import annotations

import asyncio
import logging

from api.common.errors import JobNotFound
from api.common.redis_client import get_async_redis
from api.streaming.relay import JobStreamRelay, Send

logger = logging.getLogger(__name__)


class FollowsJob:
    """Mix into a Channels consumer (before the consumer class)."""

    relay: JobStreamRelay | None = None
    _relay_task: asyncio.Task[None] | None = None

    async def open_relay(self, job_id: str, after: int, send: Send, *, look: bool = True) -> None:
        """Create the relay and (``look``) take its first look at the stream, which raises
        ServiceUnavailable when Redis is down. Without the look, a relay that cannot read the
        stream waits for the job's row to end."""
        self.relay = JobStreamRelay(job_id=job_id, after=after, redis_client=get_async_redis(), send=send)
        if look:
            await self.relay.open()

    def follow(self) -> None:
        """Run the opened relay until the job's final is sent (or the consumer stops it)."""
        assert self.relay is not None
        self._relay_task = asyncio.get_running_loop().create_task(self._run_relay(self.relay))

    async def _run_relay(self, relay: JobStreamRelay) -> None:
        try:
            await relay.run()
        except JobNotFound as exc:  # deleted while it was followed
            await self.job_gone(exc)
        except Exception:
            logger.exception("job %s: following its stream failed", relay.job_id)
            await self.relay_failed()

    async def job_gone(self, exc: JobNotFound) -> None:
        """The job was deleted before its end: tell the client and end the response."""
        raise NotImplementedError

    async def relay_failed(self) -> None:
        """An unexpected error ended the relay: end the response without a final."""
        raise NotImplementedError

    def stop_following(self) -> None:
        """Cancel the relay (safe to call twice, and from the relay's own send)."""
        task, self._relay_task = self._relay_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
