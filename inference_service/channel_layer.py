"""channels_redis's channel layer, without the lost message of a cancelled receive.

Every consumer of one daphne process receives from the same Redis key (process-local channels);
whichever consumer holds channels_redis's receive lock waits in ``BZPOPMIN`` for all of them. In
``RedisChannelLayer._brpop_with_clean`` the popped message is copied to a backup key only after
the ``BZPOPMIN`` reply has been read. When that consumer's WebSocket closes, Channels cancels its
receive: if Redis had already popped the next message, the reply is dropped with the cancelled
read and the message is gone, not in the backup. It was meant for the other consumers of the
process. (django/channels#1683 describes drops under connect/disconnect churn.)

Our relay finds such a gap from the job's Redis stream after a second of silence. Bench rounds
here showed it: the last chunk and the final of two jobs, recovered 1.3 s late, just as other
jobs' clients disconnected.

Here the pop runs shielded from the cancellation. If it returns a message after its receiver was
cancelled, that message is moved from the backup key back to the channel key, where the next
receiver's ``BZPOPMIN`` takes it.

A shielded pop outlives its receiver by up to the 5 s of ``BZPOPMIN``, holding a connection of the
pool (100 at most) all that time. Every finished request or closed socket cancels its consumer's
receive, so a web process that served more than ~20 of them a second left a waiting pop behind
each, ran out of connections, and its consumers failed with ``MaxConnectionsError`` (seen when
fuzzing the OpenAI endpoints). So a channel key has at most one pop in flight: the next receiver
adopts the pop that the cancelled one left, and takes its message if it brings one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from channels_redis.core import RedisChannelLayer

# KEYS: channel key, its backup key. ARGV: the member. Moves the member back, keeping its score.
_GIVE_BACK = """
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if score then
    redis.call('ZREM', KEYS[2], ARGV[1])
    redis.call('ZADD', KEYS[1], score, ARGV[1])
end
return score
"""


@dataclass
class _Pop:
    """A ``BZPOPMIN`` in flight on one channel key, and whether a receiver is waiting for it."""

    task: asyncio.Future[Any]
    awaited: bool = True


class CancelSafeRedisChannelLayer(RedisChannelLayer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pops: dict[tuple[int, str], _Pop] = {}
        self._give_backs: set[asyncio.Task[Any]] = set()

    async def _brpop_with_clean(self, index: int, channel: str, timeout: float) -> Any:
        key = (index, channel)
        pop = self._pops.get(key)
        # A finished pop is not adopted: its result went to its receiver, or goes back (_popped).
        if pop is None or pop.task.done() or pop.task.get_loop() is not asyncio.get_running_loop():
            pop = self._pops[key] = _Pop(asyncio.ensure_future(super()._brpop_with_clean(index, channel, timeout)))
            pop.task.add_done_callback(lambda done: self._popped(pop, index, channel))
        pop.awaited = True
        try:
            return await asyncio.shield(pop.task)
        except asyncio.CancelledError:
            pop.awaited = False  # the next receiver adopts it; if none comes first, its message goes back
            raise

    def _popped(self, pop: _Pop, index: int, channel: str) -> None:
        if self._pops.get((index, channel)) is pop:
            del self._pops[(index, channel)]
        if not pop.awaited:
            self._give_back_later(pop.task, index, channel)

    def _give_back_later(self, done: asyncio.Future[Any], index: int, channel: str) -> None:
        if done.cancelled() or done.exception() is not None or done.result() is None:
            return
        if done.get_loop().is_closed():  # the process is shutting down; the backup key keeps it
            return
        task = asyncio.ensure_future(self._give_back(index, channel, done.result()))
        self._give_backs.add(task)
        task.add_done_callback(self._give_backs.discard)

    async def _give_back(self, index: int, channel: str, member: bytes) -> None:
        await self.connection(index).eval(_GIVE_BACK, 2, channel, self._backup_channel_name(channel), member)
