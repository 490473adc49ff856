"""group_send_many delivers like channels_redis's group_send, in order, on the real Redis."""

from __future__ import annotations

import asyncio

from channels_redis.core import RedisChannelLayer
from django.conf import settings

from api.streaming.group_batch import EVENT_BATCH, group_send_many, messages_for


async def received(layer, channel: str, batches: int) -> list[dict]:
    """The messages for ``channel`` in its next ``batches`` batch events."""
    out = []
    for _ in range(batches):
        batch = await asyncio.wait_for(layer.receive(channel), 5)
        assert batch["type"] == EVENT_BATCH
        out += messages_for(channel, batch)
    return out


def test_a_batch_reaches_every_member_in_order_and_nobody_else(redis_db):
    async def scenario() -> tuple[list[dict], list[dict], list[dict]]:
        layer = RedisChannelLayer(hosts=[settings.REDIS_URL])
        a, b, c = [await layer.new_channel() for _ in range(3)]  # one process: a shared Redis key
        await layer.group_add("job.a", a)
        await layer.group_add("job.b", b)
        await layer.group_add("job.b", c)
        await group_send_many(layer, [
            ("job.a", {"type": "job.delta", "seq": 1}),
            ("job.b", {"type": "job.delta", "seq": 7}),
            ("job.a", {"type": "job.final", "seq": 1}),
            ("job.nobody", {"type": "job.delta", "seq": 1}),
        ])
        # One batch message on the process's key, routed to a, b and c.
        got_a, got_b, got_c = [await received(layer, channel, 1) for channel in (a, b, c)]
        assert await layer.connection(0).zcard(layer.prefix + layer.non_local_name(a)) == 0
        await layer.flush()
        return got_a, got_b, got_c

    got_a, got_b, got_c = asyncio.run(scenario())
    assert [(m["type"], m["seq"]) for m in got_a] == [("job.delta", 1), ("job.final", 1)]
    assert got_b == got_c == [{"type": "job.delta", "seq": 7}]


def test_the_configured_layer_holds_a_whole_process_backlog_of_many_streams(redis_db):
    """The consumers of one daphne process share one Redis queue, and channels_redis drops what
    goes over its capacity. 64 streams, 4 steps behind, with their finals: nothing may drop. (With
    a message per job and step, the default capacity of 100 dropped most of it, and a dropped
    final stalled its client ~1-2 s; a batch per step is now 5 messages on the key.)"""
    from channels.layers import get_channel_layer

    async def scenario() -> list[dict]:
        layer = get_channel_layer()
        channels = [await layer.new_channel() for _ in range(64)]
        for i, channel in enumerate(channels):
            await layer.group_add(f"job.{i}", channel)
        for step in range(1, 5):
            await group_send_many(layer, [(f"job.{i}", {"type": "job.delta", "seq": step}) for i in range(64)])
        await group_send_many(layer, [(f"job.{i}", {"type": "job.final", "seq": 4}) for i in range(64)])
        got = [m for channel in channels for m in await received(layer, channel, 5)]
        await layer.flush()
        return got

    got = asyncio.run(scenario())
    assert len(got) == 64 * 5
    assert sum(m["type"] == "job.final" for m in got) == 64
