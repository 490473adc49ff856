"""Exactly-once, in-order delivery of one job's stream to one WebSocket client.

Two sources feed a client: the per-job Redis stream (complete, replayable) and the channel-layer
group ``job.<id>`` (live, at most once: a message can be dropped when a client's channel is full).
The relay subscribes to the group *before* reading the stream, so nothing falls between the two,
then forwards only ``seq == last + 1``: older messages are duplicates and are dropped; a newer one
means something was missed, and the gap is read from the stream first. The final message goes
out after every chunk up to its ``seq``.

The group is at most once, so a relay that hears nothing for a second reads the stream itself:
a dropped final still arrives. If the stream is gone (expired, or Redis was flushed) the job's
row supplies the end: its text as one delta (only when the client has nothing yet) and the final.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from channels.db import database_sync_to_async

from api.keys import job_stream_key
from api.models import Job
from api.streaming import messages

logger = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], Awaitable[None]]

# The live group is at most once: a message (even the final) is dropped when a client's channel
# is over capacity. A relay that heard nothing for this long reads the stream itself, and every
# few such ticks also asks the database (the stream may be gone: expired, or Redis was flushed).
IDLE_CHECK_S = 1.0
DB_CHECK_EVERY = 3


class JobStreamRelay:
    def __init__(self, *, job_id: str, after: int, redis_client: aioredis.Redis, send: Send) -> None:
        self.job_id = job_id
        self.last_seq = after
        self.done = False
        self._redis = redis_client
        self._send = send
        self._lock = asyncio.Lock()
        self._sent_any = False
        self._last_id = "-"  # stream id of the last entry at or below last_seq
        self._heard_at = time.monotonic()
        self._watchdog: asyncio.Task[None] | None = None

    async def replay(self) -> None:
        """Send what the stream holds after ``last_seq`` (and the final, if it is there), then
        keep watching for what the live group might drop."""
        async with self._lock:
            final = await self._forward_stream(upto=None)
            if final is not None:
                await self._finish(final)
                return
        self._watchdog = asyncio.get_running_loop().create_task(self._watch())

    async def on_delta(self, seq: int, text: str, completion_tokens: int | None, logprobs: Any = None) -> None:
        self._heard_at = time.monotonic()
        async with self._lock:
            if self.done or seq <= self.last_seq:
                return
            if seq > self.last_seq + 1:
                await self._forward_stream(upto=seq - 1)
            if seq == self.last_seq + 1:
                await self._emit(messages.delta_message(self.job_id, seq, text, completion_tokens, logprobs))
                # The stream entry of this seq is now behind us; the next read starts after it.
            else:
                logger.warning("job %s: chunks %s..%s missing from the stream", self.job_id, self.last_seq + 1, seq - 1)

    async def on_final(self, final: dict[str, Any]) -> None:
        self._heard_at = time.monotonic()
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
            self._last_id = "-"

    def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()

    # -- internals ----------------------------------------------------------------------------

    async def _forward_stream(self, upto: int | None) -> dict[str, Any] | None:
        """Forward stream deltas with ``last_seq < seq <= upto`` in order; return the final if
        the stream has it."""
        start = "-" if self._last_id == "-" else f"({self._last_id}"
        try:
            entries = await self._redis.xrange(job_stream_key(self.job_id), min=start)
        except aioredis.RedisError:
            logger.warning("job %s: stream read failed", self.job_id, exc_info=True)
            return None
        for entry_id, fields in entries:
            message = messages.entry_to_message(self.job_id, fields)
            if message["type"] == "final":
                return message
            seq = message["seq"]
            if seq > self.last_seq + 1 or (upto is not None and seq > upto):
                break
            if seq == self.last_seq + 1:
                await self._emit(message)
            self._last_id = entry_id
        return None

    async def _emit(self, message: dict[str, Any]) -> None:
        self.last_seq = message["seq"]
        self._sent_any = True
        await self._send(message)

    async def _finish(self, final: dict[str, Any]) -> None:
        self.done = True
        await self._send(final)

    async def _watch(self) -> None:
        ticks = 0
        while not self.done:
            await asyncio.sleep(IDLE_CHECK_S)
            if time.monotonic() - self._heard_at < IDLE_CHECK_S:
                continue
            ticks += 1
            async with self._lock:
                if self.done:
                    return
                before = self.last_seq
                final = await self._forward_stream(upto=None)
                if final is not None or self.last_seq != before:
                    # The live group dropped these: the stream had them after a silence.
                    logger.warning("job %s: %s chunks%s recovered from the stream after %.1f s without live messages",
                                   self.job_id, self.last_seq - before, " and the final" if final else "",
                                   time.monotonic() - self._heard_at)
                if final is not None:
                    await self._finish(final)
                elif ticks % DB_CHECK_EVERY == 0:
                    await self._finish_if_stream_lost()

    async def _finish_if_stream_lost(self) -> None:
        job = await _load_job(self.job_id)
        if job is None or not job.is_finished:
            return
        try:
            exists = bool(await self._redis.exists(job_stream_key(self.job_id)))
        except aioredis.RedisError:
            exists = False
        if not exists:
            await self._finish_from_row(job)

    async def _finish_from_row(self, job: Job) -> None:
        if self.last_seq == 0 and job.output_text:
            await self._emit(messages.delta_message(self.job_id, max(job.last_seq, 1), job.output_text,
                                                    logprobs=job.logprobs))
        await self._finish(messages.final_from_job(job))


@database_sync_to_async
def _load_job(job_id: str) -> Job | None:
    return Job.objects.filter(id=job_id).first()
