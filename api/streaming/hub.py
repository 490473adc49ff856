"""One reader of every followed job stream of a process: :class:`StreamHub`.

Each relay (relay.py) follows one job's Redis stream. Were each to read it itself, a web process
following N streams would keep N ``XREAD BLOCK`` commands in flight, and issue about one per
stream per chunk. Instead the relays of one Redis client (one per event loop, that is per daphne
process: api/common/redis_client.py) subscribe here, and one task reads all of their streams in a
single ``XREAD BLOCK`` (every key with the last id its subscribers have), then hands each
subscriber, on its own queue, the entries after its own last id.

A relay subscribes with the id of the last entry it has handled; a new key, or a subscriber that
needs entries the hub has already read past, wakes a read in progress by an entry on the hub's
own wake stream (``stream-hub:<uuid>``, one entry long, expiring), so no subscriber waits for a
block to run out. The task runs while there are subscribers and ends when the last one leaves.
A Redis error ends nothing: the hub logs it, waits ``RETRY_S`` and reads again, while its
subscribers' relays, hearing nothing, check the job's row as they do on any silence (relay.py).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

logger = logging.getLogger(__name__)

Entry = tuple[str, dict[str, str]]

# One read waits at most this long; a subscriber that comes meanwhile wakes it.
BLOCK_MS = 1000
READ_COUNT = 512  # per stream and read
RETRY_S = 1.0  # after a failed read
WAKE_TTL_S = 60

_hubs: weakref.WeakKeyDictionary[aioredis.Redis, StreamHub] = weakref.WeakKeyDictionary()


def stream_id(raw: str) -> tuple[int, int]:
    """A stream entry id (``<ms>-<n>``) in the order Redis gives them."""
    ms, _, n = raw.partition("-")
    return int(ms), int(n or 0)


@dataclass(eq=False)
class Subscription:
    """One follower of one stream: the entries after ``last_id`` arrive on ``queue``, in order,
    as lists (one list per read)."""

    key: str
    last_id: str
    queue: asyncio.Queue[list[Entry]] = field(default_factory=asyncio.Queue)

    async def get(self, timeout: float) -> list[Entry]:
        """The entries that came next (all that are queued), or [] after ``timeout`` seconds."""
        try:
            entries = await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            return []
        while not self.queue.empty():
            entries = entries + self.queue.get_nowait()
        return entries


class StreamHub:
    """The reader of one Redis client's followed streams (get one with :func:`hub_for`)."""

    def __init__(self, redis_client: aioredis.Redis) -> None:
        self._redis = redis_client
        self._subs: dict[str, list[Subscription]] = {}  # stream key -> its subscribers
        self._read_from: dict[str, str] = {}  # stream key -> the id the next read starts after
        self._wake_key = f"stream-hub:{uuid.uuid4().hex}"
        self._wake_id = "0-0"
        self._task: asyncio.Task[None] | None = None
        self._reading = False  # a read is in flight (a new subscriber must wake it)
        self._failing = False
        self._wakes: set[asyncio.Task[None]] = set()  # held until done (the loop keeps only weak references)

    def subscribe(self, key: str, last_id: str) -> Subscription:
        sub = Subscription(key, last_id)
        subs = self._subs.setdefault(key, [])
        subs.append(sub)
        start = self._read_from.get(key)
        behind = start is None or stream_id(last_id) < stream_id(start)
        if behind:
            self._read_from[key] = last_id
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        elif behind and self._reading:
            wake = asyncio.get_running_loop().create_task(self._wake())
            self._wakes.add(wake)
            wake.add_done_callback(self._wakes.discard)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.key, [])
        if sub in subs:
            subs.remove(sub)
        if not subs:
            self._subs.pop(sub.key, None)
            self._read_from.pop(sub.key, None)

    async def _wake(self) -> None:
        try:
            pipe = self._redis.pipeline(transaction=False)
            pipe.xadd(self._wake_key, {"w": "1"}, maxlen=1)
            pipe.expire(self._wake_key, WAKE_TTL_S)
            await pipe.execute()
        except aioredis.RedisError:  # the read fails too, or ends by its block: later, not lost
            logger.debug("stream hub: wake failed", exc_info=True)

    async def _run(self) -> None:
        while self._subs:
            try:
                reply = await self._read()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis errors, and anything else: read again
                if self._subs:
                    log = logger.debug if self._failing else logger.warning
                    log("stream hub: reading %s streams failed (%s); retrying", len(self._subs), exc)
                self._failing = True
                await asyncio.sleep(RETRY_S)
                continue
            self._failing = False
            for key, entries in reply or []:
                self._deliver(key, entries)

    async def _read(self) -> list[tuple[str, list[Entry]]]:
        # Any: redis-py takes an invariant dict of its key and id unions.
        streams: dict[Any, Any] = {**self._read_from, self._wake_key: self._wake_id}
        self._reading = True
        try:
            reply: Any = await self._redis.xread(streams, count=READ_COUNT, block=BLOCK_MS)
            return reply  # RESP2, decoded: [[key, [(id, fields), ...]], ...] (redis-py types every protocol's shape)
        finally:
            self._reading = False

    def _deliver(self, key: str, entries: list[Entry]) -> None:
        if not entries:
            return
        if key == self._wake_key:
            self._wake_id = entries[-1][0]
            return
        if key in self._read_from:
            self._read_from[key] = entries[-1][0]
        for sub in self._subs.get(key, []):
            after = stream_id(sub.last_id)
            fresh = [entry for entry in entries if stream_id(entry[0]) > after]
            if fresh:
                sub.last_id = fresh[-1][0]
                sub.queue.put_nowait(fresh)


def hub_for(redis_client: aioredis.Redis) -> StreamHub:
    """The hub of ``redis_client`` (one per client, so one per daphne process's event loop)."""
    hub = _hubs.get(redis_client)
    if hub is None:
        hub = _hubs[redis_client] = StreamHub(redis_client)
    return hub
