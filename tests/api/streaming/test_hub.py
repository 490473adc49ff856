"""StreamHub against the real Redis: one XREAD for all followed streams, each subscriber's entries
after its own id, a new subscriber heard at once, and reads that go on after a Redis error."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis
import redis.asyncio as aioredis
from django.conf import settings

from api.streaming.hub import BLOCK_MS, StreamHub

pytestmark = pytest.mark.timeout(60)


class CountingRedis(aioredis.Redis):
    """The asyncio client, counting the XREADs it sends."""

    xreads = 0

    async def xread(self, *args, **kwargs):
        type(self).xreads += 1
        return await super().xread(*args, **kwargs)


@pytest.fixture
async def client():
    CountingRedis.xreads = 0
    conn = CountingRedis.from_url(settings.REDIS_URL, decode_responses=True)
    yield conn
    await conn.aclose()


@pytest.fixture
def sync_redis():
    return redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)


def key() -> str:
    return f"test-hub:{uuid.uuid4().hex}"


async def test_many_streams_are_read_by_a_few_xreads_and_each_subscriber_gets_its_own_entries(client, sync_redis):
    hub = StreamHub(client)
    keys = [key() for _ in range(40)]
    subs = [hub.subscribe(k, "0-0") for k in keys]
    await asyncio.sleep(0.05)
    for round_ in range(5):
        pipe = sync_redis.pipeline(transaction=False)
        for k in keys:
            pipe.xadd(k, {"seq": str(round_)})
        pipe.execute()
    got = {k: [] for k in keys}
    async with asyncio.timeout(10):
        while any(len(v) < 5 for v in got.values()):
            for sub in subs:
                got[sub.key] += [fields["seq"] for _, fields in await sub.get(0.01)]
    assert all(v == ["0", "1", "2", "3", "4"] for v in got.values())
    # One XREAD per stream per entry would be 200; the hub reads all 40 streams at once.
    assert CountingRedis.xreads <= 20, CountingRedis.xreads
    for sub in subs:
        hub.unsubscribe(sub)


async def test_a_second_subscriber_of_a_stream_gets_the_entries_after_its_own_id(client, sync_redis):
    hub = StreamHub(client)
    k = key()
    ids = [sync_redis.xadd(k, {"n": str(i)}) for i in range(4)]
    first = hub.subscribe(k, ids[2])
    assert [f["n"] for _, f in await first.get(5)] == ["3"]
    second = hub.subscribe(k, "0-0")  # behind what the hub has read: it reads the stream again
    assert [f["n"] for _, f in await second.get(5)] == ["0", "1", "2", "3"]
    sync_redis.xadd(k, {"n": "4"})
    assert [f["n"] for _, f in await first.get(5)] == ["4"]  # never "3" twice
    assert [f["n"] for _, f in await second.get(5)] == ["4"]
    hub.unsubscribe(first)
    hub.unsubscribe(second)


async def test_a_new_stream_is_heard_without_waiting_out_a_read_in_flight(client, sync_redis):
    hub = StreamHub(client)
    idle = hub.subscribe(key(), "0-0")  # the hub blocks on this silent stream
    await asyncio.sleep(0.1)
    k = key()
    late = hub.subscribe(k, "0-0")
    await asyncio.sleep(0.02)
    t0 = time.monotonic()
    sync_redis.xadd(k, {"n": "1"})
    assert [f["n"] for _, f in await late.get(5)] == ["1"]
    assert time.monotonic() - t0 < BLOCK_MS / 1000 / 2
    hub.unsubscribe(idle)
    hub.unsubscribe(late)


async def test_reading_goes_on_after_the_hubs_connection_is_killed(sync_redis):
    name = f"test-hub-{uuid.uuid4().hex[:12]}"
    conn = aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True, client_name=name)
    try:
        hub = StreamHub(conn)
        k = key()
        sub = hub.subscribe(k, "0-0")
        async with asyncio.timeout(5):
            while not (mine := [c for c in sync_redis.client_list()
                                if c.get("name") == name and c.get("cmd") == "xread"]):
                await asyncio.sleep(0.05)
        for c in mine:
            sync_redis.client_kill_filter(_id=c["id"])
        sync_redis.xadd(k, {"n": "1"})
        assert [f["n"] for _, f in await sub.get(10)] == ["1"]
        hub.unsubscribe(sub)
    finally:
        await conn.aclose()
