"""The WebSocket stream path through the real ASGI application and Redis: replayed and live
chunks in order, one Redis client per event loop shared by the consumers, Redis down, and the
final of a job cancelled in the queue."""

from __future__ import annotations

import asyncio

import pytest
from channels.testing import WebsocketCommunicator

from api.common.redis_client import get_async_redis
from api.common.redis_keys import job_stream_key
from api.models import JobStatus
from api.streaming import messages
from engine_worker.protocol import FinalResult, OutputChunk
from inference_service.asgi import application
from tests.api.factories import make_api_key, make_job

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the consumers' DB calls run on other threads
    pytest.mark.usefixtures("consumer_connections_closed"),
]

TEXTS = ["Once", " upon", " a", " time"]


def _chunk(job_id: str, seq: int) -> OutputChunk:
    return OutputChunk(job_id=job_id, seq=seq, text=TEXTS[seq - 1], completion_tokens=seq)


def test_replayed_and_live_deltas_reach_the_socket_in_order_and_the_final_closes_it(redis_client):
    api_key, secret = make_api_key()
    job = make_job(api_key=api_key, status=JobStatus.IN_PROGRESS)
    job_id = str(job.id)
    key = job_stream_key(job_id)
    for seq in (1, 2):  # already produced when the client connects: replayed from the stream
        redis_client.xadd(key, messages.chunk_entry(_chunk(job_id, seq)))

    async def scenario() -> tuple[list[dict], dict]:
        communicator = WebsocketCommunicator(application, f"/ws/v1/jobs/{job_id}/?api_key={secret}")
        connected, _ = await communicator.connect(timeout=10)
        assert connected
        received = [await communicator.receive_json_from(timeout=10) for _ in range(2)]
        for seq in (3, 4):  # live, as the worker's sink writes them
            redis_client.xadd(key, messages.chunk_entry(_chunk(job_id, seq)))
            received.append(await communicator.receive_json_from(timeout=10))
        redis_client.xadd(key, messages.final_entry(FinalResult(
            job_id=job_id, text="".join(TEXTS), finish_reason="length", prompt_tokens=3, completion_tokens=4,
            last_seq=4)))
        received.append(await communicator.receive_json_from(timeout=10))
        closed = await communicator.receive_output(timeout=10)
        return received, closed

    received, closed = asyncio.run(scenario())
    assert [(m["type"], m["seq"]) for m in received] == [("delta", 1), ("delta", 2), ("delta", 3), ("delta", 4),
                                                         ("final", 4)]
    assert "".join(m.get("text", "") for m in received) == "".join(TEXTS)
    assert closed["type"] == "websocket.close"


def test_consumers_on_one_event_loop_share_one_redis_client(redis_client):
    async def two_clients():
        return get_async_redis(), get_async_redis()

    first, second = asyncio.run(two_clients())
    other_loop, _ = asyncio.run(two_clients())
    assert first is second
    assert other_loop is not first  # a client's connections belong to the loop that made them


def test_without_redis_the_socket_gets_an_error_and_close_code_4503_not_a_crash(redis_client, monkeypatch):
    import redis.asyncio
    import redis.exceptions

    api_key, secret = make_api_key()
    job_id = str(make_job(api_key=api_key, status=JobStatus.IN_PROGRESS).id)

    async def down(*_args, **_kwargs):
        raise redis.exceptions.ConnectionError("Redis is down")

    monkeypatch.setattr(redis.asyncio.Redis, "xread", down)

    async def scenario():
        communicator = WebsocketCommunicator(application, f"/ws/v1/jobs/{job_id}/?api_key={secret}")
        assert (await communicator.connect(timeout=10))[0]
        message = await communicator.receive_json_from(timeout=10)
        closed = await communicator.receive_output(timeout=10)
        await communicator.disconnect(timeout=10)
        return message, closed

    message, closed = asyncio.run(scenario())
    assert message["type"] == "error" and message["error"]["code"] == "service_unavailable"
    assert closed["type"] == "websocket.close" and closed["code"] == 4503


def test_a_watcher_of_a_queued_job_gets_its_final_as_soon_as_it_is_cancelled(redis_client):
    from channels.db import database_sync_to_async

    from api.jobs.services.cancel import job_cancel

    api_key, secret = make_api_key()
    job = make_job(api_key=api_key)
    job_id = str(job.id)

    async def scenario() -> tuple[dict, float, dict]:
        communicator = WebsocketCommunicator(application, f"/ws/v1/jobs/{job_id}/?api_key={secret}")
        connected, _ = await communicator.connect(timeout=10)
        assert connected
        await asyncio.sleep(0.2)  # following its (still empty) stream
        started = asyncio.get_running_loop().time()
        # As a view would (its connection closed after), on a thread of its own.
        await database_sync_to_async(job_cancel, thread_sensitive=False)(job_id=job_id, owner=api_key.owner)
        # Well under the relay's own check of the database (3 s of silence, relay.py).
        final = await communicator.receive_json_from(timeout=1.0)
        waited = asyncio.get_running_loop().time() - started
        closed = await communicator.receive_output(timeout=5)  # the server closes after the final
        await communicator.disconnect()
        return final, waited, closed

    final, waited, closed = asyncio.run(scenario())

    assert final["type"] == "final" and final["job_id"] == job_id and final["status"] == "cancelled"
    assert waited < 1.0
    assert closed["type"] == "websocket.close"
