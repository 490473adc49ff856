"""Exactly-once, in-order delivery of one job's stream to one WebSocket client.

Two sources feed a client: the per-job Redis stream (complete, replayable) and the channel-layer
group ``job.<id>`` (live, at most once: a message can be dropped when a client's channel is full).
The relay subscribes to the group *before* reading the stream, so nothing falls between the two,
then forwards only ``seq == last + 1``: older messages are duplicates and are dropped; a newer one
means something was missed, and the gap is read from the stream first. The final message goes
out after every chunk up to its ``seq``.

If the stream is gone (expired, or Redis was flushed) the job's row supplies the end: its text
as one delta (only when the client has nothing yet) and the final.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from channels.db import database_sync_to_async

from api.keys import job_stream_key
from api.models import Job
from api.streaming import messages

logger = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], Awaitable[None]]

# When the database already says "finished" but the stream has no final yet, the worker is
# between its DB write and its stream write (milliseconds); wait this long before using the row.
FINAL_GRACE_S = 2.0


class JobStreamRelay:
    def __init__(self, *, job_id: str, after: int, redis_client: aioredis.Redis, send: Send) -> None:
        self.job_id = job_id
        self.last_seq = after
        self.done = False
        self._redis = redis_client
        self._send = send
        self._lock = asyncio.Lock()
        self._sent_any = False
        self._fallback: asyncio.Task[None] | None = None

    async def replay(self) -> None:
        """Send what the stream holds after ``last_seq``; finish from the row if it is over."""
        async with self._lock:
            final = await self._forward_stream(upto=None)
            if final is not None:
                await self._finish(final)
                return
            job = await _load_job(self.job_id)
            if job is None or not job.is_finished:
                return
            if await self._stream_exists():
                self._fallback = asyncio.get_running_loop().create_task(self._finish_later())
            else:
                await self._finish_from_row(job)

    async def on_delta(self, seq: int, text: str, completion_tokens: int | None) -> None:
        async with self._lock:
            if self.done or seq <= self.last_seq:
                return
            if seq > self.last_seq + 1:
                await self._forward_stream(upto=seq - 1)
            if seq == self.last_seq + 1:
                await self._emit(messages.delta_message(self.job_id, seq, text, completion_tokens))
            else:
                logger.warning("job %s: chunks %s..%s missing from the stream", self.job_id, self.last_seq + 1, seq - 1)

    async def on_final(self, final: dict[str, Any]) -> None:
        async with self._lock:
            if self.done:
                return
            if int(final["seq"]) > self.last_seq:
                await self._forward_stream(upto=int(final["seq"]))
            await self._finish(final)

    async def on_reset(self) -> None:
        """A new attempt of the job starts from scratch (its previous worker died)."""
        async with self._lock:
            if self._sent_any and not self.done:
                await self._send({"type": "reset", "job_id": self.job_id})
            self.last_seq = 0

    def close(self) -> None:
        if self._fallback is not None:
            self._fallback.cancel()

    # -- internals ----------------------------------------------------------------------------

    async def _forward_stream(self, upto: int | None) -> dict[str, Any] | None:
        """Forward stream deltas with ``last_seq < seq <= upto``; return the final if present."""
        try:
            entries = await self._redis.xrange(job_stream_key(self.job_id))
        except aioredis.RedisError:
            logger.warning("job %s: stream read failed", self.job_id, exc_info=True)
            return None
        final = None
        for _entry_id, fields in entries:
            message = messages.entry_to_message(self.job_id, fields)
            if message["type"] == "final":
                final = message
                continue
            seq = message["seq"]
            if seq == self.last_seq + 1 and (upto is None or seq <= upto):
                await self._emit(message)
        return final

    async def _emit(self, message: dict[str, Any]) -> None:
        self.last_seq = message["seq"]
        self._sent_any = True
        await self._send(message)

    async def _finish(self, final: dict[str, Any]) -> None:
        self.done = True
        await self._send(final)

    async def _stream_exists(self) -> bool:
        try:
            return bool(await self._redis.exists(job_stream_key(self.job_id)))
        except aioredis.RedisError:
            return False

    async def _finish_later(self) -> None:
        await asyncio.sleep(FINAL_GRACE_S)
        async with self._lock:
            if self.done:
                return
            final = await self._forward_stream(upto=None)
            job = await _load_job(self.job_id)
            if final is not None:
                await self._finish(final)
            elif job is not None:
                await self._finish_from_row(job)

    async def _finish_from_row(self, job: Job) -> None:
        if self.last_seq == 0 and job.output_text:
            await self._emit(messages.delta_message(self.job_id, max(job.last_seq, 1), job.output_text))
        await self._finish(
            messages.final_message(
                job_id=self.job_id, seq=job.last_seq, status=job.status, finish_reason=job.finish_reason,
                prompt_tokens=job.prompt_tokens, completion_tokens=job.completion_tokens,
                cached_tokens=job.cached_tokens, error=job.error,
            )
        )


@database_sync_to_async
def _load_job(job_id: str) -> Job | None:
    return Job.objects.filter(id=job_id).first()
