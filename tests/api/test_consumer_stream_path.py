"""The WebSocket stream path through the real ASGI application, Redis and the channel layer:
no per-message thread hop, and one Redis client per event loop shared by the consumers."""

from __future__ import annotations

import asyncio
from unittest import mock

import pytest
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from api.keys import job_group_name, job_stream_key
from api.models import JobStatus
from api.redis_client import get_async_redis
from api.streaming import messages
from engine_worker.protocol import OutputChunk
from inference_service.asgi import application
from tests.api.factories import make_api_key, make_job

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the consumers' DB calls run on other threads
    pytest.mark.usefixtures("consumer_connections_closed"),
]

TEXTS = ["Once", " upon", " a", " time"]


def _chunk(job_id: str, seq: int) -> OutputChunk:
    return OutputChunk(job_id=job_id, seq=seq, text=TEXTS[seq - 1], completion_tokens=seq)


def test_live_deltas_reach_the_socket_without_a_thread_hop_per_message(redis_client):
    api_key, secret = make_api_key()
    job = make_job(api_key=api_key, status=JobStatus.IN_PROGRESS)
    job_id = str(job.id)
    for seq in (1, 2):  # already produced when the client connects: replayed from the stream
        redis_client.xadd(job_stream_key(job_id), messages.chunk_entry(_chunk(job_id, seq)))

    async def scenario() -> list[dict]:
        communicator = WebsocketCommunicator(application, f"/ws/v1/jobs/{job_id}/?api_key={secret}")
        connected, _ = await communicator.connect(timeout=10)
        assert connected
        received = [await communicator.receive_json_from(timeout=10) for _ in range(2)]
        layer = get_channel_layer()
        for seq in (3, 4):  # live: stream first, then the group, as the worker's sink does
            redis_client.xadd(job_stream_key(job_id), messages.chunk_entry(_chunk(job_id, seq)))
            await layer.group_send(job_group_name(job_id), {"type": messages.EVENT_DELTA, "seq": seq,
                                                           "text": TEXTS[seq - 1], "completion_tokens": seq})
            received.append(await communicator.receive_json_from(timeout=10))
        await communicator.disconnect()
        return received

    with mock.patch("channels.consumer.aclose_old_connections") as hop:
        received = asyncio.run(scenario())

    assert [(m["type"], m["seq"], m["text"]) for m in received] == [("delta", i, TEXTS[i - 1]) for i in (1, 2, 3, 4)]
    # Channels' own dispatch makes this hop for the connect and for every channel-layer message.
    assert hop.call_count == 0


def test_consumers_on_one_event_loop_share_one_redis_client(redis_client):
    async def two_clients():
        return get_async_redis(), get_async_redis()

    first, second = asyncio.run(two_clients())
    other_loop, _ = asyncio.run(two_clients())
    assert first is second
    assert other_loop is not first  # a client's connections belong to the loop that made them


def test_one_batch_message_feeds_every_socket_of_the_process_its_own_events(redis_client):
    from api.streaming.group_batch import group_send_many

    api_key, secret = make_api_key()
    job_ids = [str(make_job(api_key=api_key, status=JobStatus.IN_PROGRESS).id) for _ in range(2)]

    async def scenario() -> list[list[dict]]:
        sockets = []
        for job_id in job_ids:
            communicator = WebsocketCommunicator(application, f"/ws/v1/jobs/{job_id}/?api_key={secret}")
            assert (await communicator.connect(timeout=10))[0]
            sockets.append(communicator)
        events = []
        for seq in (1, 2, 3):  # interleaved, as one sink batch of several steps would carry them
            for job_id in job_ids:
                redis_client.xadd(job_stream_key(job_id), messages.chunk_entry(_chunk(job_id, seq)))
                events.append((job_group_name(job_id), {"type": messages.EVENT_DELTA, "seq": seq,
                                                        "text": TEXTS[seq - 1], "completion_tokens": seq}))
        await group_send_many(get_channel_layer(), events)
        got = [[await s.receive_json_from(timeout=10) for _ in range(3)] for s in sockets]
        for s in sockets:
            await s.disconnect()
        return got

    got = asyncio.run(scenario())
    for job_id, received in zip(job_ids, got, strict=True):
        assert [(m["job_id"], m["seq"], m["text"]) for m in received] == [(job_id, i, TEXTS[i - 1]) for i in (1, 2, 3)]


def test_without_redis_the_socket_gets_an_error_and_close_code_4503_not_a_crash(redis_client, monkeypatch):
    import redis.exceptions

    api_key, secret = make_api_key()
    job_id = str(make_job(api_key=api_key, status=JobStatus.IN_PROGRESS).id)

    async def down(*_args, **_kwargs):
        raise redis.exceptions.ConnectionError("Redis is down")

    monkeypatch.setattr(get_channel_layer(), "group_add", down)

    async def scenario():
        communicator = WebsocketCommunicator(application, f"/ws/v1/jobs/{job_id}/?api_key={secret}")
        assert (await communicator.connect(timeout=10))[0]
        message = await communicator.receive_json_from(timeout=10)
        closed = await communicator.receive_output(timeout=10)
        await communicator.wait(timeout=10)
        return message, closed

    message, closed = asyncio.run(scenario())
    assert message["type"] == "error" and message["error"]["code"] == "service_unavailable"
    assert closed["type"] == "websocket.close" and closed["code"] == 4503


def test_a_watcher_of_a_queued_job_gets_its_final_as_soon_as_it_is_cancelled(redis_client):
    from channels.db import database_sync_to_async

    from api.services.jobs import job_cancel

    api_key, secret = make_api_key()
    job = make_job(api_key=api_key)
    job_id = str(job.id)

    async def scenario() -> tuple[dict, float]:
        communicator = WebsocketCommunicator(application, f"/ws/v1/jobs/{job_id}/?api_key={secret}")
        connected, _ = await communicator.connect(timeout=10)
        assert connected
        await asyncio.sleep(0.2)  # subscribed and replayed (nothing yet)
        started = asyncio.get_running_loop().time()
        # As a view would (its connection closed after), on a thread of its own.
        await database_sync_to_async(job_cancel, thread_sensitive=False)(job_id=job_id, owner=api_key.owner)
        # Well under the relay's own check of the database (3 s of silence, relay.py).
        final = await communicator.receive_json_from(timeout=1.0)
        waited = asyncio.get_running_loop().time() - started
        await communicator.wait(timeout=5)  # the server closes after the final
        return final, waited

    final, waited = asyncio.run(scenario())

    assert final["type"] == "final" and final["job_id"] == job_id and final["status"] == "cancelled"
    assert waited < 1.0
