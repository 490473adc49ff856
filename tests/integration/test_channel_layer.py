"""A receive cancelled while Redis hands it a message does not lose the message (real Redis)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from channels_redis.core import RedisChannelLayer
from django.conf import settings

from inference_service.channel_layer import CancelSafeRedisChannelLayer


async def _cancel_while_the_reply_is_in_flight(layer_class, monkeypatch) -> dict | None:
    """One process, two consumers. Consumer a waits in BZPOPMIN; a message for b arrives and Redis
    pops it for a; a is cancelled (its WebSocket closed) before it has read the reply. What does b
    get within two seconds?"""
    real_bzpopmin = aioredis.Redis.bzpopmin
    popped = asyncio.Event()

    async def bzpopmin_with_a_slow_reply(self, *args, **kwargs):
        result = await real_bzpopmin(self, *args, **kwargs)
        if result is not None:
            popped.set()
            await asyncio.sleep(0.3)  # the reply is on its way when the cancellation comes
        return result

    monkeypatch.setattr(aioredis.Redis, "bzpopmin", bzpopmin_with_a_slow_reply)
    layer = layer_class(hosts=[settings.REDIS_URL])
    a, b = await layer.new_channel(), await layer.new_channel()
    receiving = asyncio.ensure_future(layer.receive(a))
    await asyncio.sleep(0.1)  # a holds the receive lock and waits in BZPOPMIN
    await layer.send(b, {"type": "job.final", "seq": 3})
    await asyncio.wait_for(popped.wait(), 2)
    receiving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await receiving
    try:
        return await asyncio.wait_for(layer.receive(b), 2)
    except TimeoutError:
        return None
    finally:
        await layer.flush()


def test_a_cancelled_receive_gives_the_message_back_for_the_other_consumers(redis_db, monkeypatch):
    got = asyncio.run(_cancel_while_the_reply_is_in_flight(CancelSafeRedisChannelLayer, monkeypatch))
    assert got == {"type": "job.final", "seq": 3}


def test_channels_redis_alone_loses_it(redis_db, monkeypatch):
    # The defect this layer exists for: if this starts passing, channels_redis fixed it upstream.
    assert asyncio.run(_cancel_while_the_reply_is_in_flight(RedisChannelLayer, monkeypatch)) is None


def test_the_service_uses_the_cancel_safe_layer():
    assert settings.CHANNEL_LAYERS["default"]["BACKEND"] == "inference_service.channel_layer.CancelSafeRedisChannelLayer"


async def _consumers_come_and_go(layer_class, churn: int) -> dict:
    """Consumers of one process start receiving and leave (each finished request or closed socket
    cancels its receive) faster than BZPOPMIN's 5 s wait ends, then one more receives a message.
    The pool allows 10 connections, so the churn must not hold one per departed consumer."""
    layer = layer_class(hosts=[{"address": settings.REDIS_URL, "max_connections": 10}])
    channel = await layer.new_channel()
    try:
        for _ in range(churn):
            receiving = asyncio.ensure_future(layer.receive(channel))
            await asyncio.sleep(0.02)  # it holds the receive lock and waits in BZPOPMIN
            receiving.cancel()
            with pytest.raises(asyncio.CancelledError):
                await receiving
        await layer.send(channel, {"type": "job.final", "seq": 7})
        return await asyncio.wait_for(layer.receive(channel), 3)
    finally:
        await layer.flush()


def test_departing_consumers_leave_one_wait_in_redis_not_one_each(redis_db):
    got = asyncio.run(_consumers_come_and_go(CancelSafeRedisChannelLayer, churn=30))
    assert got == {"type": "job.final", "seq": 7}
