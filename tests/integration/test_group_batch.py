"""group_send_many delivers like channels_redis's group_send, in order, on the real Redis."""

from __future__ import annotations

import asyncio

from channels_redis.core import RedisChannelLayer
from django.conf import settings

from api.streaming.group_batch import group_send_many


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
        got_a = [await asyncio.wait_for(layer.receive(a), 5) for _ in range(2)]
        got_b = [await asyncio.wait_for(layer.receive(b), 5)]
        got_c = [await asyncio.wait_for(layer.receive(c), 5)]
        await layer.flush()
        return got_a, got_b, got_c

    got_a, got_b, got_c = asyncio.run(scenario())
    assert [(m["type"], m["seq"]) for m in got_a] == [("job.delta", 1), ("job.final", 1)]
    assert got_b == got_c == [{"type": "job.delta", "seq": 7}]


def test_the_configured_layer_holds_a_whole_process_backlog_of_many_streams(redis_db):
    """The consumers of one daphne process share one Redis queue, and channels_redis drops what
    goes over its capacity. 64 streams, 4 steps behind, with their finals: nothing may drop (the
    default capacity of 100 dropped most of it, and a dropped final stalled its client ~1-2 s)."""
    from channels.layers import get_channel_layer

    async def scenario() -> list[dict]:
        layer = get_channel_layer()
        channels = [await layer.new_channel() for _ in range(64)]
        for i, channel in enumerate(channels):
            await layer.group_add(f"job.{i}", channel)
        for step in range(1, 5):
            await group_send_many(layer, [(f"job.{i}", {"type": "job.delta", "seq": step}) for i in range(64)])
        await group_send_many(layer, [(f"job.{i}", {"type": "job.final", "seq": 4}) for i in range(64)])
        got = [await asyncio.wait_for(layer.receive(channel), 5) for channel in channels for _ in range(5)]
        await layer.flush()
        return got

    got = asyncio.run(scenario())
    assert len(got) == 64 * 5
    assert sum(m["type"] == "job.final" for m in got) == 64
