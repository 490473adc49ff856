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
"""

from __future__ import annotations

import asyncio
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


class CancelSafeRedisChannelLayer(RedisChannelLayer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._give_backs: set[asyncio.Task[Any]] = set()

    async def _brpop_with_clean(self, index: int, channel: str, timeout: float) -> Any:
        pop = asyncio.ensure_future(super()._brpop_with_clean(index, channel, timeout))
        try:
            return await asyncio.shield(pop)
        except asyncio.CancelledError:
            pop.add_done_callback(lambda done: self._give_back_later(done, index, channel))
            raise

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
