"""``{"type": "cancel"}`` on a job's WebSocket (and on ``/ws/v1/generate``) cancels the job, and
its final ends the stream; through the real ASGI application and Redis."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.testing import WebsocketCommunicator

from api.common import redis_keys
from api.common.redis_client import channel_db
from api.models import Job, JobStatus
from api.streaming import messages
from engine_worker.protocol import FinalResult, OutputChunk
from inference_service.asgi import application
from tests.api.factories import make_api_key, make_job

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the consumers' DB calls run on other threads
    pytest.mark.usefixtures("consumer_connections_closed"),
]


async def _open(path: str) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, path)
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    return communicator


def test_cancel_on_a_queued_jobs_socket_cancels_it_and_its_final_ends_the_stream(redis_client):
    api_key, secret = make_api_key()
    job = make_job(api_key=api_key)

    async def scenario() -> tuple[dict, dict]:
        communicator = await _open(f"/ws/v1/jobs/{job.id}/?api_key={secret}")
        await communicator.send_json_to({"type": "cancel"})
        final = await communicator.receive_json_from(timeout=2)
        closed = await communicator.receive_output(timeout=5)
        return final, closed

    final, closed = asyncio.run(scenario())

    assert final["type"] == "final" and final["status"] == "cancelled" and final["job_id"] == str(job.id)
    assert closed["type"] == "websocket.close"
    assert Job.objects.get(id=job.id).status == JobStatus.CANCELLED


def test_cancel_on_a_running_jobs_socket_asks_its_worker_and_the_workers_final_ends_the_stream(redis_client):
    api_key, secret = make_api_key()
    job = make_job(api_key=api_key, status=JobStatus.IN_PROGRESS, worker_id="w-1")
    job_id = str(job.id)
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(redis_keys.cancel_channel(channel_db(redis_client)))
    pubsub.get_message(timeout=1)

    async def scenario() -> dict:
        communicator = await _open(f"/ws/v1/jobs/{job_id}/?api_key={secret}")
        await communicator.send_json_to({"type": "cancel"})
        for _ in range(100):  # the worker is told on the cancel channel
            await asyncio.sleep(0.05)  # (the consumer runs on this loop)
            told = pubsub.get_message(timeout=0)
            if told is not None:
                break
        assert told is not None and json.loads(told["data"]) == {"job_id": job_id}
        # ... and its sink publishes the aborted job's final, as a worker does
        result = FinalResult(job_id=job_id, text="", finish_reason="abort", prompt_tokens=3, completion_tokens=0)
        redis_client.xadd(redis_keys.job_stream_key(job_id), messages.final_entry(result))
        return await communicator.receive_json_from(timeout=2)

    final = asyncio.run(scenario())
    pubsub.close()

    assert final["type"] == "final" and final["status"] == "cancelled"
    assert Job.objects.get(id=job_id).cancel_requested is True


@pytest.mark.parametrize("sent", ["not json", json.dumps({"type": "pause"}), json.dumps({"type": "cancel", "x": 1})])
def test_any_other_message_gets_an_error_and_the_stream_goes_on(redis_client, sent):
    api_key, secret = make_api_key()
    job = make_job(api_key=api_key, status=JobStatus.IN_PROGRESS, worker_id="w-1")
    job_id = str(job.id)

    async def scenario() -> tuple[dict, dict]:
        communicator = await _open(f"/ws/v1/jobs/{job_id}/?api_key={secret}")
        await communicator.send_to(text_data=sent)
        error = await communicator.receive_json_from(timeout=2)
        redis_client.xadd(redis_keys.job_stream_key(job_id), messages.chunk_entry(
            OutputChunk(job_id=job_id, seq=1, text="Once", completion_tokens=1)))
        delta = await communicator.receive_json_from(timeout=2)
        await communicator.disconnect()
        return error, delta

    error, delta = asyncio.run(scenario())

    assert error["type"] == "error" and error["error"]["code"] == "invalid_message"
    assert delta == {"type": "delta", "job_id": job_id, "seq": 1, "text": "Once", "completion_tokens": 1}
    assert Job.objects.get(id=job_id).cancel_requested is False


def test_cancel_of_a_job_that_finished_meanwhile_gets_an_error_not_a_close(redis_client):
    api_key, secret = make_api_key()
    job = make_job(api_key=api_key, status=JobStatus.IN_PROGRESS, worker_id="w-1")

    async def scenario() -> tuple[dict, bool]:
        communicator = await _open(f"/ws/v1/jobs/{job.id}/?api_key={secret}")
        await asyncio.sleep(0.5)  # the relay has looked at the row (running) and follows the stream
        # Finished in the database; its final is still on its way to this socket.
        await asyncio.to_thread(lambda: Job.objects.filter(id=job.id).update(status=JobStatus.COMPLETED))
        await communicator.send_json_to({"type": "cancel"})
        error = await communicator.receive_json_from(timeout=2)
        still_open = await communicator.receive_nothing(timeout=0.3)
        await communicator.disconnect()
        return error, still_open

    error, still_open = asyncio.run(scenario())

    assert error["type"] == "error" and error["error"]["code"] == "job_not_cancellable"
    assert still_open


def test_cancel_on_the_generate_socket_cancels_the_job_it_submitted(redis_client, dispatched):
    api_key, secret = make_api_key()

    async def scenario() -> tuple[dict, dict]:
        communicator = await _open(f"/ws/v1/generate?api_key={secret}")
        await communicator.send_json_to({"prompt": "Once upon a time", "max_tokens": 8})
        submitted = await communicator.receive_json_from(timeout=5)
        await communicator.send_json_to({"type": "cancel"})
        final = await communicator.receive_json_from(timeout=2)
        return submitted, final

    submitted, final = asyncio.run(scenario())

    assert submitted["type"] == "job"
    assert final["type"] == "final" and final["job_id"] == submitted["id"] and final["status"] == "cancelled"
    assert Job.objects.get(id=submitted["id"]).status == JobStatus.CANCELLED
