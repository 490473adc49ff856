"""Drills: Redis flushed (broker messages, channel layer, job streams, heartbeats: all of it) with
jobs queued, and with jobs streaming. Nothing is lost: every job completes, and a client that
was following a job ends with the stored text (or a clear error) within seconds."""

from __future__ import annotations

import asyncio

import pytest
import redis

from tests.drills.checks import assert_all_completed, assert_no_server_errors, assert_streams_match
from tests.drills.client import DrillClient
from tests.drills.stack import frozen

pytestmark = [pytest.mark.drill, pytest.mark.slow, pytest.mark.timeout(300)]


def _flush(stack) -> None:
    redis.Redis.from_url(stack.redis_url).flushdb()


def test_jobs_queued_when_redis_is_flushed_all_complete(stack, tokens):
    workers = stack.ensure_workers(1)
    client = DrillClient(stack.port, stack.user_keys()[0])
    # No worker takes anything meanwhile: the jobs wait in the queue, their messages in Redis.
    with frozen([stack.workers[w].pid for w in workers]):
        ids = asyncio.run(client.submit_many(6, prefix="Flushed", max_tokens=16, eos=tokens["eos"]))
        _flush(stack)
    stored = asyncio.run(client.poll_all(ids, timeout=60))
    assert_all_completed(stored, ids, {job_id: 16 for job_id in ids})
    assert_no_server_errors(client)


def test_jobs_streaming_when_redis_is_flushed_complete_and_their_followers_end_with_the_stored_text(stack, tokens):
    stack.ensure_workers(1)
    client = DrillClient(stack.port, stack.user_keys()[0])

    async def scenario():
        ids = await client.submit_many(6, prefix="Flushed", max_tokens=400, eos=tokens["eos"])
        follows = [asyncio.create_task(client.follow(job_id, timeout=30)) for job_id in ids]
        await client.until_running(ids)
        await asyncio.to_thread(_flush, stack)
        late = [asyncio.create_task(client.follow(job_id, timeout=30)) for job_id in ids[:2]]  # joining after
        return ids, await asyncio.gather(*follows), await asyncio.gather(*late)

    ids, followed, late = asyncio.run(scenario())
    stored = asyncio.run(client.poll_all(ids, timeout=60))
    assert_all_completed(stored, ids, {job_id: 400 for job_id in ids})
    assert_streams_match(dict(zip(ids, followed, strict=True)), stored)
    assert_streams_match(dict(zip(ids[:2], late, strict=True)), stored)
    assert_no_server_errors(client)

