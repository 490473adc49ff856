"""Drills: engine workers leaving with jobs in flight. SIGTERM (the worker drains briefly, hands
the rest back and exits; another worker finishes them) and kill -9 (the jobs wait for their
lease, then run on the worker a supervisor starts in its place). Nothing is lost, and each
follower ends with the stored text (after a ``reset`` where the job started again). A job
cancelled while its worker is frozen, which is then killed, ends cancelled."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from tests.drills.checks import assert_all_completed, assert_no_server_errors, assert_streams_match
from tests.drills.client import DrillClient
from tests.drills.stack import frozen

pytestmark = [pytest.mark.drill, pytest.mark.slow, pytest.mark.timeout(300)]


def test_sigterm_to_one_of_two_workers_loses_no_job(stack, tokens):
    stack.ensure_workers(2)
    client = DrillClient(stack.port, stack.user_keys()[0])

    async def scenario():
        ids = await client.submit_many(6, prefix="Worker drill", max_tokens=600, eos=tokens["eos"])
        follows = [asyncio.create_task(client.follow(job_id, timeout=90)) for job_id in ids]
        holders = await client.until_running(ids)
        leaving = Counter(holders.values()).most_common(1)[0][0]
        started = time.monotonic()
        code = await asyncio.to_thread(stack.workers[leaving].stop, 60)
        return ids, leaving, code, time.monotonic() - started, await asyncio.gather(*follows)

    ids, leaving, code, took, followed = asyncio.run(scenario())
    assert code == 0, stack.workers[leaving].log_tail()
    assert took < 30
    stored = asyncio.run(client.poll_all(ids, timeout=60))
    assert_all_completed(stored, ids, {job_id: 600 for job_id in ids})
    assert_streams_match(dict(zip(ids, followed, strict=True)), stored)
    assert_no_server_errors(client)


def test_kill_9_of_a_worker_with_20_jobs_in_flight_loses_none(stack, tokens):
    stack.ensure_workers(1)
    client = DrillClient(stack.port, stack.user_keys()[0])

    async def scenario():
        ids = await client.submit_many(20, prefix="Worker drill", max_tokens=300, eos=tokens["eos"])
        follows = [asyncio.create_task(client.follow(job_id, timeout=120)) for job_id in ids[::2]]
        holders = await client.until_running(ids)
        [victim] = set(holders.values())
        await asyncio.to_thread(stack.workers[victim].kill9)
        stack.start_worker()  # as a supervisor restarts it
        stored = await client.poll_all(ids, timeout=120)
        return ids, victim, stored, await asyncio.gather(*follows)

    ids, victim, stored, followed = asyncio.run(scenario())
    assert_all_completed(stored, ids, {job_id: 300 for job_id in ids})
    assert victim not in {body["worker_id"] for body in stored.values()}
    assert_streams_match(dict(zip(ids[::2], followed, strict=True)), stored)
    assert_no_server_errors(client)



def test_a_job_cancelled_while_its_worker_is_frozen_ends_cancelled_once_the_worker_is_killed(stack, tokens):
    stack.ensure_workers(1)
    client = DrillClient(stack.port, stack.user_keys()[0])

    async def scenario():
        [job_id] = await client.submit_many(1, prefix="Cancel drill", max_tokens=2000, eos=tokens["eos"])
        follow = asyncio.create_task(client.follow(job_id, timeout=60))
        [holder] = (await client.until_running([job_id])).values()
        with frozen([stack.workers[holder].pid]):
            status, body = await asyncio.to_thread(client.call, "POST", f"/api/v1/jobs/{job_id}/cancel")
            assert status in (200, 202) and body["cancel_requested"], body
            await asyncio.to_thread(stack.workers[holder].kill9)
        return job_id, await client.poll_all([job_id], timeout=30), await follow

    job_id, stored, followed = asyncio.run(scenario())
    assert stored[job_id]["status"] == "cancelled", stored[job_id]
    assert followed.final is not None and followed.final["status"] == "cancelled", followed
    assert_no_server_errors(client)
