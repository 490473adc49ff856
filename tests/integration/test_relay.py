"""JobStreamRelay against the real Redis: replay, dedupe, gap filling, and a dropped final."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from django.conf import settings

from api.keys import job_stream_key
from api.streaming import messages
from api.streaming.relay import JobStreamRelay
from engine_worker.protocol import FinalResult, OutputChunk

JOB = "00000000-0000-0000-0000-000000000001"
TEXTS = ["Once", " upon", " a", " time", ","]


def write_stream(client, n_chunks: int, *, final: bool) -> None:
    for seq in range(1, n_chunks + 1):
        chunk = OutputChunk(job_id=JOB, seq=seq, text=TEXTS[seq - 1], completion_tokens=seq)
        client.xadd(job_stream_key(JOB), messages.chunk_entry(chunk))
    if final:
        result = FinalResult(job_id=JOB, text="".join(TEXTS[:n_chunks]), finish_reason="length",
                             prompt_tokens=3, completion_tokens=n_chunks, last_seq=n_chunks)
        client.xadd(job_stream_key(JOB), messages.final_entry(result))


async def run_relay(after: int, scenario) -> list[dict]:
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    client = aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    relay = JobStreamRelay(job_id=JOB, after=after, redis_client=client, send=send)
    try:
        await relay.replay()
        await scenario(relay)
    finally:
        relay.close()
        await client.aclose()
    return sent


def seqs(sent: list[dict]) -> list[int]:
    return [m["seq"] for m in sent if m["type"] == "delta"]


def test_a_late_client_replays_after_its_seq_and_gets_the_final(redis_db):
    write_stream(redis_db, 5, final=True)

    async def nothing(relay):
        assert relay.done

    sent = asyncio.run(run_relay(2, nothing))
    assert seqs(sent) == [3, 4, 5]
    assert "".join(m["text"] for m in sent if m["type"] == "delta") == "".join(TEXTS[2:])
    assert sent[-1]["type"] == "final" and sent[-1]["usage"]["completion_tokens"] == 5


def test_live_duplicates_are_dropped_and_gaps_are_filled_from_the_stream(redis_db):
    write_stream(redis_db, 2, final=False)

    async def live(relay):
        await relay.on_delta(2, TEXTS[1], 2)  # already replayed: a duplicate
        for seq in (3, 4, 5):  # 3 and 4 were dropped by the group, 5 arrives
            redis_db.xadd(job_stream_key(JOB), messages.chunk_entry(
                OutputChunk(job_id=JOB, seq=seq, text=TEXTS[seq - 1], completion_tokens=seq)))
        await relay.on_delta(5, TEXTS[4], 5)
        await relay.on_delta(4, TEXTS[3], 4)  # late and out of order
        await relay.on_final(messages.final_message(job_id=JOB, seq=5, status="completed", finish_reason="length",
                                                    prompt_tokens=3, completion_tokens=5, cached_tokens=0, error=None))

    sent = asyncio.run(run_relay(0, live))
    assert seqs(sent) == [1, 2, 3, 4, 5]
    assert "".join(m["text"] for m in sent if m["type"] == "delta") == "".join(TEXTS)
    assert [m["type"] for m in sent].count("final") == 1


def test_a_final_dropped_by_the_live_group_still_arrives_from_the_stream(redis_db, caplog):
    write_stream(redis_db, 3, final=False)

    async def dropped(relay):
        final = FinalResult(job_id=JOB, text="".join(TEXTS[:3]), finish_reason="stop",
                                        prompt_tokens=3, completion_tokens=3, last_seq=3)
        redis_db.xadd(job_stream_key(JOB), messages.final_entry(final))
        for _ in range(100):  # no live message at all: the relay must notice by itself
            if relay.done:
                return
            await asyncio.sleep(0.05)

    with caplog.at_level("WARNING", logger="api.streaming.relay"):
        sent = asyncio.run(run_relay(0, dropped))
    assert seqs(sent) == [1, 2, 3]
    assert sent[-1]["type"] == "final" and sent[-1]["finish_reason"] == "stop"
    # Operators see that the live group lost something (a stall of a second for the client).
    assert any("recovered from the stream" in r.getMessage() and "the final" in r.getMessage() for r in caplog.records)

