"""End to end with real parts: daphne, an engine worker subprocess, Redis and Postgres."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import websockets

from api.models import JobStatus
from tests.api.factories import make_api_key
from tests.integration.client import ServiceClient, deltas, text_of
from tests.integration.jobs import job, queue_job, wait_status
from tests.integration.procs import START_TIMEOUT_S, free_port, port_open, start_daphne, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROMPTS = ["Once upon a time", "The quick brown fox", "def main():", "In the beginning", "Dear diary,"]


@pytest.fixture
def stack(workers, service_env, tmp_path):
    """Two daphne processes on a free port (as scripts/run.sh serves) and one engine worker;
    returns the port. Streams then cross processes: the worker's messages reach whichever
    process holds the socket through the Redis channel layer."""
    port = free_port()
    daphne = start_daphne(service_env, port, tmp_path, processes=2)
    workers.start("w-e2e")

    def up() -> bool:
        assert daphne.alive(), daphne.log_tail()
        return port_open(port)

    wait_for(up, START_TIMEOUT_S, "daphne to listen")
    yield port
    daphne.stop()


def test_twenty_jobs_half_streamed_half_polled_all_complete_with_streamed_text_equal_to_stored(stack):
    _key, secret = make_api_key()
    client = ServiceClient(stack, secret)

    async def scenario() -> tuple[list[str], dict[str, list[dict]], dict[str, dict]]:
        bodies = [{"prompt": f"{PROMPTS[i % 5]} {i}", "max_tokens": 24 + 4 * i, "temperature": 0.0}
                  for i in range(20)]
        ids = await asyncio.gather(*(client.submit(b) for b in bodies))
        streamed_ids, polled_ids = ids[::2], ids[1::2]
        streams, polled = await asyncio.gather(
            asyncio.gather(*(client.stream(j) for j in streamed_ids)),
            asyncio.gather(*(client.poll(j) for j in polled_ids)),
        )
        stored = {j: await client.get(j) for j in ids}
        return ids, dict(zip(streamed_ids, streams, strict=True)), stored

    ids, streams, stored = asyncio.run(scenario())
    assert all(stored[j]["status"] == "completed" for j in ids), [stored[j]["status"] for j in ids]
    for job_id, messages in streams.items():
        body = stored[job_id]
        assert [m["seq"] for m in deltas(messages)] == list(range(1, len(deltas(messages)) + 1))
        assert text_of(messages) == body["output_text"]
        final = messages[-1]
        assert final["type"] == "final" and final["status"] == "completed"
        assert final["finish_reason"] == body["finish_reason"]
        assert final["usage"]["completion_tokens"] == body["usage"]["completion_tokens"] > 0
    assert len({stored[j]["worker_id"] for j in ids}) == 1


def test_resume_with_after_delivers_every_chunk_exactly_once_in_order(stack):
    api_key, secret = make_api_key()
    client = ServiceClient(stack, secret)
    job_id = queue_job("Once upon a time", max_tokens=400, api_key=api_key)

    async def scenario() -> tuple[list[dict], list[dict], list[dict]]:
        first = await client.stream(job_id, limit=3)  # a client that drops after 3 chunks...
        rest = await client.stream(job_id, after=deltas(first)[-1]["seq"])  # ...and comes back
        late = await client.stream(job_id, after=5)  # a late client, after the end
        return first, rest, late

    first, rest, late = asyncio.run(scenario())
    stored = job(job_id)
    assert stored.status == JobStatus.COMPLETED
    seqs = [m["seq"] for m in deltas(first) + deltas(rest)]
    assert seqs == list(range(1, stored.last_seq + 1))
    assert text_of(first) + text_of(rest) == stored.output_text
    assert [m["seq"] for m in deltas(late)] == list(range(6, stored.last_seq + 1))
    assert late[-1]["type"] == "final" and late[-1]["usage"]["completion_tokens"] == 400


def test_server_sent_events_stream_jobs_and_resume_with_last_event_id(stack):
    _key, secret = make_api_key()
    client = ServiceClient(stack, secret)

    async def scenario():
        # The third is long enough to be cut after 3 chunks (one per 40 ms stream interval).
        ids = await asyncio.gather(*(client.submit({"prompt": p, "max_tokens": n, "temperature": 0.0})
                                     for p, n in zip(PROMPTS[:3], (40, 40, 96), strict=True)))
        whole = await asyncio.gather(*(asyncio.to_thread(client.events, j) for j in ids[:2]))
        # The third: drop the connection after 3 chunks, then reconnect as an EventSource does.
        _, first = await asyncio.to_thread(client.events, ids[2], limit=3)
        _, rest = await asyncio.to_thread(client.events, ids[2], last_event_id=first[-1]["id"])
        again = await asyncio.to_thread(client.events, ids[2], last_event_id=rest[-1]["id"])
        stored = [await client.get(j) for j in ids]
        return whole, first, rest, again, stored

    whole, first, rest, again, stored = asyncio.run(scenario())
    for (status, events), body in zip(whole, stored[:2], strict=True):
        assert status == 200 and body["status"] == "completed"
        assert events[-1]["event"] == "final" and events[-1]["data"]["usage"] == body["usage"]
        seqs = [e["data"]["seq"] for e in events if e["event"] == "delta"]
        assert seqs == list(range(1, len(seqs) + 1))
        assert "".join(e["data"]["text"] for e in events if e["event"] == "delta") == body["output_text"]
    resumed = [e for e in first + rest if e["event"] == "delta"]
    assert len(first) == 3 and all(e["event"] == "delta" for e in first)
    assert [e["data"]["seq"] for e in resumed] == list(range(1, len(resumed) + 1))  # each chunk once, in order
    assert "".join(e["data"]["text"] for e in resumed) == stored[2]["output_text"]
    assert rest[-1]["event"] == "final" and rest[-1]["id"].endswith(":final")
    assert again == (204, [])  # after the final, a reconnect is told to stop


def test_cancel_of_a_running_job_over_rest_stops_it_within_a_second(stack, redis_db):
    api_key, secret = make_api_key()
    client = ServiceClient(stack, secret)
    job_id = queue_job("Once upon a time", max_tokens=3000, api_key=api_key)
    wait_for(lambda: job(job_id).first_token_at is not None, 120, "the job to start generating")
    asyncio.run(client.cancel(job_id))
    cancelled_at = time.monotonic()
    stored = wait_status(job_id, (JobStatus.CANCELLED,), timeout=30)
    assert time.monotonic() - cancelled_at < 1.0
    assert stored.finish_reason == "abort" and 0 < stored.completion_tokens < 3000
    time.sleep(0.5)
    assert job(job_id).completion_tokens == stored.completion_tokens  # nothing after the stop


def test_websocket_auth_and_ownership_close_codes_and_generate_socket(stack):
    owner_key, secret = make_api_key()
    _other_key, other_secret = make_api_key()
    client = ServiceClient(stack, secret)
    job_id = queue_job("Dear diary,", max_tokens=8, api_key=owner_key)

    async def close_code(path: str, *, auth: bool = True, as_client: ServiceClient = client) -> int:
        async with as_client.connect(path, auth=auth) as ws:
            try:
                while True:
                    await asyncio.wait_for(ws.recv(), 30)
            except websockets.ConnectionClosed as closed:
                return closed.rcvd.code

    async def generate() -> list[dict]:
        async with client.connect("/ws/v1/generate") as ws:
            await ws.send(json.dumps({"prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0}))
            return [json.loads(raw) async for raw in ws]

    async def scenario():
        return (
            await close_code(f"/ws/v1/jobs/{job_id}/", auth=False),
            await close_code(f"/ws/v1/jobs/{job_id}/?api_key=wrong", auth=False),
            await close_code(f"/ws/v1/jobs/{job_id}/", as_client=ServiceClient(stack, other_secret)),
            await close_code(f"/ws/v1/jobs/{job_id}/?api_key={secret}", auth=False),
            await generate(),
        )

    missing, bad, foreign, by_query, generated = asyncio.run(scenario())
    assert (missing, bad, foreign, by_query) == (4401, 4401, 4404, 1000)
    assert generated[0]["type"] == "job" and generated[-1]["type"] == "final"
    stored = job(generated[0]["id"])
    assert text_of(generated) == stored.output_text and stored.status == JobStatus.COMPLETED


def test_a_client_waiting_longer_than_the_redis_socket_timeout_still_gets_the_stream(stack):
    api_key, secret = make_api_key()
    client = ServiceClient(stack, secret)
    # Held by a worker that never streams: nothing arrives for longer than 5 s. (A queued job
    # would not wait: the database's notice wakes the stack's worker even with no message.)
    job_id = queue_job("Once upon a time", max_tokens=16, api_key=api_key, held_by="w-stalled")

    async def scenario() -> list[dict]:
        task = asyncio.create_task(client.stream(job_id))
        await asyncio.sleep(7.0)
        assert not task.done(), task.result()
        await asyncio.to_thread(_hand_back, job_id)
        return await task

    messages = asyncio.run(scenario())
    stored = job(job_id)
    assert messages[-1]["type"] == "final" and text_of(messages) == stored.output_text


def _hand_back(job_id: str) -> None:
    """The stalled worker hands the job back, as on its shutdown."""
    from api.jobs.services.dispatch import job_dispatch_counted
    from api.jobs.services.lifecycle import job_hand_back

    assert job_hand_back(job_id=job_id, worker_id="w-stalled", redispatch_after_s=30)
    assert job_dispatch_counted(job_id=job_id)
