"""``group_send`` for a whole output batch: two Redis round trips, and one message per Redis key.

channels_redis's ``group_send`` costs, per message, a ZREMRANGEBYSCORE and a ZRANGE on the
group, a pipeline and an EVAL: with 32 running jobs that is ~130 round trips per engine step, and
the profile of the worker showed the fan-out loop busier than the engine itself. This sends the
messages of one batch with the same storage layout and semantics (group expiry, per-channel
capacity and expiry, ``__asgi_channel__`` for process-local channels, the layer's serializer),
using only the layer's public methods and attributes:

1. one pipeline per connection: expire stale members, then read the members of every group;
2. one EVAL per connection: add one ``job.batch`` message to each key that has member channels
   (every process-local channel of one daphne process shares its process's key).

Within a batch each channel's messages keep the order given, and batches get increasing scores.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

logger = logging.getLogger(__name__)

EVENT_BATCH = "job.batch"  # Channels maps it to the consumer method job_batch

# KEYS: channel keys (n). ARGV: messages (n), capacities (n), scores (n), expiry, stale cutoff.
_SEND_MANY_LUA = """
local n = #KEYS
local expiry = ARGV[3 * n + 1]
local cutoff = ARGV[3 * n + 2]
local over = 0
for i = 1, n do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, cutoff)
    if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[n + i]) then
        redis.call('ZADD', KEYS[i], ARGV[2 * n + i], ARGV[i])
        redis.call('EXPIRE', KEYS[i], expiry)
    else
        over = over + 1
    end
end
return over
"""


async def group_send_many(layer: Any, events: list[tuple[str, dict[str, Any]]]) -> None:
    """Send each ``(group, message)`` to the group's channels, in order per channel.

    What reaches a Redis key is one ``job.batch`` message per call, whatever the number of events:
    ``{"type": "job.batch", "__asgi_channel__": [channels...], "events": {channel: [messages...]}}``.
    The consumers of one daphne process share one key, and channels_redis pops, decodes and
    routes every entry of it with a few round trips of its own; with a message per job and
    step, that receive path was a fifth of daphne's CPU during a 32-job burst. A consumer takes
    its own list from ``events`` (:func:`messages_for`)."""
    now = time.time()
    members = await _members(layer, list(dict.fromkeys(group for group, _ in events)), now)
    per_key: dict[str, tuple[dict[str, Any], int, int]] = {}
    for group, message in events:
        for channel in members[group]:
            non_local = layer.non_local_name(channel) if "!" in channel else channel
            key = layer.prefix + non_local
            if key not in per_key:
                body = {"type": EVENT_BATCH, "__asgi_channel__": [], "events": {}}
                per_key[key] = (body, layer.get_capacity(channel), layer.consistent_hash(non_local))
            body = per_key[key][0]
            if channel not in body["events"]:
                body["__asgi_channel__"].append(channel)
                body["events"][channel] = []
            body["events"][channel].append(message)
    deliveries: dict[int, list[tuple[str, bytes, int]]] = collections.defaultdict(list)
    for key, (body, capacity, index) in per_key.items():
        deliveries[index].append((key, layer.serialize(body), capacity))
    for index, items in deliveries.items():
        keys = [key for key, _, _ in items]
        scores = [f"{now + i * 1e-6:.6f}" for i in range(len(items))]
        over = await layer.connection(index).eval(
            _SEND_MANY_LUA, len(keys), *keys, *(m for _, m, _ in items), *(c for _, _, c in items),
            *scores, int(layer.expiry), int(now) - int(layer.expiry),
        )
        if over:
            logger.warning("%s of %s channel messages over capacity (the relay fills them in from the stream)",
                           over, len(items))


def messages_for(channel: str, batch: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages of a ``batch`` event meant for ``channel``, in the order they were sent."""
    return batch["events"].get(channel, [])


async def _members(layer: Any, groups: list[str], now: float) -> dict[str, list[str]]:
    by_connection: dict[int, list[str]] = collections.defaultdict(list)
    for group in groups:
        by_connection[layer.consistent_hash(group)].append(group)
    members: dict[str, list[str]] = {}
    for index, names in by_connection.items():
        pipe = layer.connection(index).pipeline(transaction=False)
        for group in names:
            key = f"{layer.prefix}:group:{group}"  # channels_redis's group key layout
            pipe.zremrangebyscore(key, min=0, max=int(now) - layer.group_expiry)
            pipe.zrange(key, 0, -1)
        results = await pipe.execute()
        for i, group in enumerate(names):
            members[group] = [m.decode("utf8") for m in results[2 * i + 1]]
    return members
