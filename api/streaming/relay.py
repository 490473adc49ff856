"""Exactly-once, in-order delivery of one job's stream to one client.

A job's outputs live in its Redis stream ``job:<id>:chunks`` (messages.py): deltas with
consecutive seqs, then one final. When a job runs again after its worker died, the new attempt
starts the stream afresh with a ``reset`` entry, whose seq comes after every seq of the earlier
attempt, and its deltas go on from there; so a seq names one chunk of one attempt, and a client
resuming with ``after=<seq>`` is never given another attempt's text without a ``reset`` first.

The relay reads the stream from its start (a first ``XREAD`` of its own, then the entries the
process's :class:`~api.streaming.hub.StreamHub` reads for it, one ``XREAD BLOCK`` for every
followed stream of the process) and forwards, in order: every
delta after the client's seq, a reset when the client holds text of an earlier attempt, and the
final. Nothing else carries a job's chunks, so there is no second copy to reconcile.

The job's row, not the stream, is the truth. When the stream cannot say what comes next (entries
are missing: Redis was flushed, or the stream expired), or stays silent while the row says the job
has ended, the relay ends from the row: the text the client lacks as one delta (a reset and the
whole text, if what the client holds is not a prefix of the stored text) and the final.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from channels.db import database_sync_to_async

from api.common.errors import JobNotFound, ServiceUnavailable
from api.common.redis_keys import job_stream_key
from api.models import Job
from api.streaming import messages
from api.streaming.hub import Subscription, hub_for, stream_id

logger = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], Awaitable[None]]

# One read waits this long for new entries. While the stream is silent the row is read every few
# such waits, so a job whose end never reached its stream still ends within seconds.
BLOCK_S = 1.0
ROW_CHECK_EVERY = 3
READ_COUNT = 512

# What a client hears when Redis cannot be reached: the job itself is safe in the database.
STREAM_UNAVAILABLE = "The job's stream is unavailable right now; poll GET /api/v1/jobs/<id> or retry."


class JobStreamRelay:
    def __init__(self, *, job_id: str, after: int, redis_client: aioredis.Redis, send: Send) -> None:
        self.job_id = job_id
        self.last_seq = after
        self.done = False
        self._redis = redis_client
        self._send = send
        self._key = job_stream_key(job_id)
        self._holds_unknown_text = after > 0  # text from before this connection, not seen here
        self._sent: list[str] = []  # text sent since the client's last reset
        self._tokens_sent = 0
        self._lost = False  # the stream lacks entries this client needs: the row gives the end
        self._first: list[tuple[str, dict[str, str]]] | None = None  # what open() read
        self._read_failing = False
        self._last_id = "0-0"  # the last stream entry handled

    async def open(self) -> None:
        """Take a first look at the stream. Raises :class:`ServiceUnavailable` when Redis cannot
        be reached: there is nothing to follow then (the job itself is safe in the database)."""
        try:
            reply = await self._redis.xread({self._key: "0-0"}, count=READ_COUNT)
        except aioredis.RedisError as exc:
            logger.warning("job %s: cannot read its stream", self.job_id, exc_info=True)
            raise ServiceUnavailable(STREAM_UNAVAILABLE) from exc
        self._first = _entries(reply)

    async def run(self) -> None:
        """Forward the stream until the final is sent; returns then. Raises :class:`JobNotFound`
        when the job is gone (deleted) before it could end. Cancel the task to stop early."""
        entries, self._first = self._first or [], []
        hub = hub_for(self._redis)
        sub: Subscription | None = None
        silent = 0
        try:
            while True:
                if entries:
                    silent = 0
                    await self._handle(entries)
                    if self.done:
                        return
                else:
                    if self._lost or silent % ROW_CHECK_EVERY == 0:
                        await self._end_if_row_finished()
                        if self.done:
                            return
                    silent += 1
                if sub is None:  # after the first look: the hub reads on from there
                    sub = hub.subscribe(self._key, self._last_id)
                entries = await sub.get(BLOCK_S)
        finally:
            if sub is not None:
                hub.unsubscribe(sub)

    async def _handle(self, entries: list[tuple[str, dict[str, str]]]) -> None:
        """Forward ``entries`` in order, each once (the hub and a direct read may both bring one)."""
        for entry_id, fields in entries:
            if stream_id(entry_id) <= stream_id(self._last_id):
                continue
            self._last_id = entry_id
            await self._on_entry(fields)
            if self.done:
                return

    async def _read(self) -> list[tuple[str, dict[str, str]]]:
        """What the stream holds after the last entry handled, read now (no wait)."""
        try:
            reply = await self._redis.xread({self._key: self._last_id}, count=READ_COUNT)
        except aioredis.RedisError as exc:
            log = logger.debug if self._read_failing else logger.warning
            log("job %s: stream read failed (%s); the row will tell its end", self.job_id, exc)
            self._read_failing = True
            return []
        self._read_failing = False
        return _entries(reply)

    async def _on_entry(self, fields: dict[str, str]) -> None:
        kind = fields.get("type", "delta")
        seq = int(fields["seq"])
        if kind == "reset":
            if seq > self.last_seq:  # what the client holds (if anything) is an earlier attempt's
                await self._reset(seq)
                self._lost = False
            return
        if kind == "final":
            if self._lost or seq > self.last_seq:  # chunks are missing: the row has them
                self._lost = True
                await self._end_from_row(await _load_job(self.job_id))  # written before the final
            else:
                await self._finish(messages.entry_to_message(self.job_id, fields))
            return
        if self._lost or seq <= self.last_seq:
            return
        if seq == self.last_seq + 1:
            await self._emit(messages.entry_to_message(self.job_id, fields))
        else:
            logger.warning("job %s: chunks %s..%s are missing from its stream; ending from the database",
                           self.job_id, self.last_seq + 1, seq - 1)
            self._lost = True

    async def _end_if_row_finished(self) -> None:
        job = await _load_job(self.job_id)
        if job is not None and not job.is_finished:
            return
        # The row is written before the stream's final: read what came meanwhile before deciding.
        await self._handle(await self._read())
        if not self.done:
            await self._end_from_row(job)

    async def _end_from_row(self, job: Job | None) -> None:
        if job is None:
            raise JobNotFound(self.job_id)
        if not job.is_finished:
            return
        text = job.output_text
        sent = "".join(self._sent)
        if self._holds_unknown_text or not text.startswith(sent):
            await self._reset(self.last_seq + 1)
            sent = ""
        if len(text) > len(sent):
            logprobs = job.logprobs[self._tokens_sent:] if job.logprobs else None
            await self._emit(messages.delta_message(self.job_id, self.last_seq + 1, text[len(sent):],
                                                    job.completion_tokens, logprobs))
        final = messages.final_from_job(job)
        final["seq"] = self.last_seq
        await self._finish(final)

    async def _reset(self, seq: int) -> None:
        if self._sent or self._holds_unknown_text:
            await self._send({"type": "reset", "job_id": self.job_id, "seq": seq})
        self.last_seq = seq
        self._sent = []
        self._tokens_sent = 0
        self._holds_unknown_text = False

    async def _emit(self, message: dict[str, Any]) -> None:
        self.last_seq = message["seq"]
        self._sent.append(message["text"])
        self._tokens_sent = message.get("completion_tokens") or self._tokens_sent
        await self._send(message)

    async def _finish(self, final: dict[str, Any]) -> None:
        self.done = True
        await self._send(final)


@database_sync_to_async
def _load_job(job_id: str) -> Job | None:
    return Job.objects.filter(id=job_id, deleted_at__isnull=True).first()


def _entries(reply: Any) -> list[tuple[str, dict[str, str]]]:
    """The entries of a one-stream XREAD reply (RESP2, decoded: ``[[key, entries]]``; redis-py
    types it as the union of every protocol's shape)."""
    return reply[0][1] if reply else []
