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
