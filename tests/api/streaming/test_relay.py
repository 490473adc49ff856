"""JobStreamRelay against the real Redis and database: replay, live chunks, a restart's reset, and
the end from the row when the stream cannot give it (flushed, expired, silent)."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from django.conf import settings

from api.common.errors import JobNotFound, ServiceUnavailable
from api.common.redis_keys import job_stream_key
from api.models import Job, JobStatus
from api.streaming import messages
from api.streaming.relay import JobStreamRelay
from engine_worker.protocol import FinalResult, OutputChunk
from tests.api.factories import make_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("consumer_connections_closed")]

TEXTS = ["Once", " upon", " a", " time", ",", " there", " was", " a", " fox"]


def chunk(job_id: str, seq: int, text: str | None = None) -> dict[str, str]:
    text = TEXTS[(seq - 1) % len(TEXTS)] if text is None else text
    return messages.chunk_entry(OutputChunk(job_id=job_id, seq=seq, text=text, completion_tokens=seq))


def final(job_id: str, seq: int, text: str = "") -> dict[str, str]:
    return messages.final_entry(FinalResult(job_id=job_id, text=text, finish_reason="length", prompt_tokens=3,
                                            completion_tokens=seq, last_seq=seq))


def write(redis_client, job_id: str, *entries: dict[str, str]) -> None:
    for entry in entries:
        redis_client.xadd(job_stream_key(job_id), entry)


def finish_row(job: Job, text: str, last_seq: int) -> None:
    Job.objects.filter(id=job.id).update(status=JobStatus.COMPLETED, finish_reason="length", output_text=text,
                                         completion_tokens=last_seq, last_seq=last_seq)


class Client:
    """One relay on its own asyncio client, with what it sent."""

    def __init__(self, job_id: str, after: int = 0) -> None:
        self.sent: list[dict] = []
        self.job_id, self.after = job_id, after

    async def follow(self, scenario=None, timeout: float = 15.0) -> list[dict]:
        redis = aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
        relay = JobStreamRelay(job_id=self.job_id, after=self.after, redis_client=redis, send=self._send)
        try:
            await relay.open()
            task = asyncio.ensure_future(relay.run())
            if scenario is not None:
                await scenario()
            await asyncio.wait_for(task, timeout)
        finally:
            await redis.aclose()
        return self.sent

    async def _send(self, message: dict) -> None:
        self.sent.append(message)

    @property
    def text(self) -> str:
        """The text as a client that follows the README holds it: a reset drops what it had."""
        parts: list[str] = []
        for message in self.sent:
            if message["type"] == "reset":
                parts = []
            elif message["type"] == "delta":
                parts.append(message["text"])
        return "".join(parts)

    def kinds(self) -> list[tuple[str, int]]:
        return [(m["type"], m["seq"]) for m in self.sent]


def test_a_late_client_replays_after_its_seq_and_gets_the_final(redis_client):
    job = make_job(status=JobStatus.COMPLETED)
    write(redis_client, str(job.id), *(chunk(str(job.id), s) for s in range(1, 5)), final(str(job.id), 4))
    client = Client(str(job.id), after=2)
    asyncio.run(client.follow())
    assert client.kinds() == [("delta", 3), ("delta", 4), ("final", 4)]


def test_live_chunks_arrive_in_order_then_the_final_ends_the_stream(redis_client):
    job = make_job(status=JobStatus.IN_PROGRESS)
    write(redis_client, str(job.id), chunk(str(job.id), 1))

    async def worker() -> None:
        for seq in (2, 3):
            await asyncio.sleep(0.05)
            write(redis_client, str(job.id), chunk(str(job.id), seq))
        write(redis_client, str(job.id), final(str(job.id), 3))

    client = Client(str(job.id))
    asyncio.run(client.follow(worker))
    assert client.kinds() == [("delta", 1), ("delta", 2), ("delta", 3), ("final", 3)]
    assert client.text == "Once upon a"


def test_a_live_client_is_told_to_reset_when_the_job_runs_again(redis_client):
    job = make_job(status=JobStatus.IN_PROGRESS)
    key = job_stream_key(str(job.id))
    write(redis_client, str(job.id), chunk(str(job.id), 1), chunk(str(job.id), 2))

    async def worker_dies_and_another_restarts() -> None:
        await asyncio.sleep(0.2)
        redis_client.delete(key)  # what api/worker/admission.py does, then the new attempt's chunks
        write(redis_client, str(job.id), messages.reset_entry(3), chunk(str(job.id), 4, "New"),
              chunk(str(job.id), 5, " text"), final(str(job.id), 5))

    client = Client(str(job.id))
    asyncio.run(client.follow(worker_dies_and_another_restarts))
    assert client.kinds() == [("delta", 1), ("delta", 2), ("reset", 3), ("delta", 4), ("delta", 5), ("final", 5)]
    assert client.text == "New text"


@pytest.mark.parametrize(("after", "expected"), [
    (0, [("delta", 4), ("delta", 5), ("final", 5)]),  # a new client: nothing to drop
    (2, [("reset", 3), ("delta", 4), ("delta", 5), ("final", 5)]),  # holds the first attempt's text
    (3, [("delta", 4), ("delta", 5), ("final", 5)]),  # saw the reset already
    (4, [("delta", 5), ("final", 5)]),
])
def test_a_client_resuming_across_a_restart_gets_a_reset_only_when_it_holds_old_text(redis_client, after, expected):
    job = make_job(status=JobStatus.COMPLETED)
    write(redis_client, str(job.id), messages.reset_entry(3), chunk(str(job.id), 4, "New"),
          chunk(str(job.id), 5, " text"), final(str(job.id), 5))
    client = Client(str(job.id), after=after)
    asyncio.run(client.follow())
    assert client.kinds() == expected


def test_after_a_redis_flush_mid_job_every_client_ends_with_the_stored_text_within_seconds(redis_client):
    # The stream lost its first 77 chunks; the worker went on writing 78.. and the final.
    job = make_job(status=JobStatus.IN_PROGRESS)
    stored = "".join(f"w{seq} " for seq in range(1, 81))
    write(redis_client, str(job.id), *(chunk(str(job.id), s, f"w{s} ") for s in range(78, 81)))

    async def job_ends() -> None:
        await asyncio.sleep(0.3)
        await sync_to_async(finish_row)(job, stored, 80)  # the row first, then the stream's final (the sink's order)
        write(redis_client, str(job.id), final(str(job.id), 80))

    started = time.monotonic()
    fresh = Client(str(job.id))
    asyncio.run(fresh.follow(job_ends))
    assert fresh.text == stored and fresh.sent[-1]["type"] == "final"
    assert fresh.sent[-1]["status"] == "completed"
    assert time.monotonic() - started < 5

    late = Client(str(job.id))  # connects after the end: the stream holds 78..80 and the final
    asyncio.run(late.follow())
    assert late.text == stored and late.kinds()[-1][0] == "final"


def test_a_client_that_had_part_of_the_text_gets_the_rest_from_the_row(redis_client):
    job = make_job(status=JobStatus.IN_PROGRESS)
    write(redis_client, str(job.id), chunk(str(job.id), 1), chunk(str(job.id), 2))

    async def flush_then_end() -> None:
        await asyncio.sleep(0.3)
        redis_client.delete(job_stream_key(str(job.id)))  # Redis flushed while the job ran
        write(redis_client, str(job.id), chunk(str(job.id), 5))
        await sync_to_async(finish_row)(job, "Once upon a time,", 5)
        write(redis_client, str(job.id), final(str(job.id), 5))

    client = Client(str(job.id))
    asyncio.run(client.follow(flush_then_end))
    assert [m["type"] for m in client.sent] == ["delta", "delta", "delta", "final"]  # no reset: a prefix
    assert client.text == "Once upon a time,"


def test_a_finished_job_whose_stream_expired_ends_from_the_row_at_once(redis_client):
    job = make_job(status=JobStatus.COMPLETED, output_text="All done.", last_seq=7, completion_tokens=7,
                   finish_reason="stop")
    started = time.monotonic()
    client = Client(str(job.id))
    asyncio.run(client.follow())
    assert client.text == "All done." and client.sent[-1]["type"] == "final"
    assert time.monotonic() - started < 1.0


def test_a_final_that_never_reached_the_stream_comes_from_the_row(redis_client):
    job = make_job(status=JobStatus.IN_PROGRESS)
    write(redis_client, str(job.id), chunk(str(job.id), 1))

    async def row_ends_silently() -> None:
        await asyncio.sleep(0.2)
        await sync_to_async(finish_row)(job, "Once upon", 2)

    client = Client(str(job.id))
    asyncio.run(client.follow(row_ends_silently))
    assert client.text == "Once upon" and client.sent[-1]["type"] == "final"


def test_a_job_deleted_while_it_is_followed_raises_job_not_found(redis_client, monkeypatch):
    from api.streaming import relay as relay_module

    monkeypatch.setattr(relay_module, "BLOCK_S", 0.05)  # the relay's checks of the row, sooner
    job = make_job(status=JobStatus.IN_PROGRESS)

    async def delete() -> None:
        await asyncio.sleep(0.2)
        await sync_to_async(Job.objects.filter(id=job.id).delete)()

    with pytest.raises(JobNotFound):
        asyncio.run(Client(str(job.id)).follow(delete))


def test_a_client_that_leaves_mid_read_costs_the_others_nothing(redis_client):
    # Consumers come and go (their reads are cancelled) while others follow on the same client:
    # every follower that stays gets every chunk (the channel layer lost such messages, channels#1683).
    jobs = [make_job(status=JobStatus.IN_PROGRESS) for _ in range(4)]

    async def scenario() -> list[list[dict]]:
        redis = aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
        stayers = [Client(str(job.id)) for job in jobs]
        relays = [JobStreamRelay(job_id=c.job_id, after=0, redis_client=redis, send=c._send) for c in stayers]
        tasks = [asyncio.ensure_future(r.run()) for r in relays]
        for round_ in range(10):
            leaver = JobStreamRelay(job_id=str(jobs[round_ % 4].id), after=0, redis_client=redis,
                                    send=lambda m: asyncio.sleep(0))
            leaving = asyncio.ensure_future(leaver.run())
            await asyncio.sleep(0.02)
            for job in jobs:
                write(redis_client, str(job.id), chunk(str(job.id), round_ + 1))
            leaving.cancel()
        for job in jobs:
            write(redis_client, str(job.id), final(str(job.id), 10))
        await asyncio.wait_for(asyncio.gather(*tasks), 15)
        await redis.aclose()
        return [c.sent for c in stayers]

    for sent in asyncio.run(scenario()):
        assert [(m["type"], m["seq"]) for m in sent] == [("delta", s) for s in range(1, 11)] + [("final", 10)]


def test_without_redis_opening_the_relay_is_service_unavailable():
    async def scenario() -> None:
        redis = aioredis.Redis.from_url("redis://127.0.0.1:1/0", decode_responses=True)
        relay = JobStreamRelay(job_id="00000000-0000-0000-0000-000000000001", after=0, redis_client=redis,
                               send=lambda m: asyncio.sleep(0))
        try:
            await relay.open()
        finally:
            await redis.aclose()

    with pytest.raises(ServiceUnavailable):
        asyncio.run(scenario())


def test_more_followers_than_redis_pys_default_pool_all_get_the_stream(redis_client):
    # Each follower waits in XREAD BLOCK on a connection of its own; 150 of them share one
    # event loop's client, as one web process's consumers do (redis-py's default pool holds 100).
    from api.common.redis_client import get_async_redis

    job = make_job(status=JobStatus.IN_PROGRESS)

    async def scenario() -> list[list[dict]]:
        redis = get_async_redis()
        clients = [Client(str(job.id)) for _ in range(150)]
        relays = [JobStreamRelay(job_id=str(job.id), after=0, redis_client=redis, send=c._send) for c in clients]
        tasks = []
        for i, relay in enumerate(relays):
            await relay.open()  # the later ones while the earlier ones wait in XREAD BLOCK
            tasks.append(asyncio.ensure_future(relay.run()))
            if i == 119:
                await asyncio.sleep(1.0)
        await asyncio.sleep(1.0)
        write(redis_client, str(job.id), chunk(str(job.id), 1), final(str(job.id), 1))
        await asyncio.wait_for(asyncio.gather(*tasks), 20)
        return [c.sent for c in clients]

    for sent in asyncio.run(scenario()):
        assert [(m["type"], m["seq"]) for m in sent] == [("delta", 1), ("final", 1)]
