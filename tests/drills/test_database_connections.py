"""Drill: every database connection of the running service terminated (``pg_terminate_backend``)
while jobs stream and clients poll. No request answers 500 (a request that meets a dead connection
is a 503 with the error envelope), every job completes, and streamed text equals stored text. PostgreSQL only: SQLite has no server sessions to end."""

from __future__ import annotations

import asyncio

import pytest

from tests.drills.checks import assert_all_completed, assert_no_server_errors, assert_streams_match
from tests.drills.client import DrillClient, Followed
from tests.drills.stack import terminate_connections

pytestmark = [pytest.mark.drill, pytest.mark.slow, pytest.mark.timeout(300)]


async def follow_retrying(client: DrillClient, job_id: str) -> Followed:
    """Follow as the README tells a client to: a socket refused with ``service_unavailable``
    (its connect met a terminated connection, before anything was streamed) is opened again."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        got = await client.follow(job_id, timeout=max(deadline - loop.time(), 1))
        refused = got.error is not None and got.error["error"]["code"] == "service_unavailable" and not got.seqs
        if not refused or loop.time() > deadline:
            return got
        await asyncio.sleep(1)


def test_terminated_database_connections_cost_no_request_and_no_job(stack, tokens):
    if not stack.database_url.startswith("postgres"):
        pytest.skip("SQLite has no server connections to terminate")
    stack.ensure_workers(1)
    client = DrillClient(stack.port, stack.user_keys()[0])

    async def scenario():
        ids = await client.submit_many(6, prefix="Connection", max_tokens=300, eos=tokens["eos"])
        follows = [asyncio.create_task(follow_retrying(client, job_id)) for job_id in ids]
        await client.until_running(ids)
        ended = 0
        for _ in range(3):  # again while the service reconnects
            ended += await asyncio.to_thread(terminate_connections, stack.database_url)
            await asyncio.gather(*(asyncio.to_thread(client.call, "GET", f"/api/v1/jobs/{job_id}")
                                   for job_id in ids for _ in range(3)))
        return ids, ended, await asyncio.gather(*follows)

    ids, ended, followed = asyncio.run(scenario())
    assert ended > 0
    stored = asyncio.run(client.poll_all(ids, timeout=60))
    assert_all_completed(stored, ids, {job_id: 300 for job_id in ids})
    assert_streams_match(dict(zip(ids, followed, strict=True)), stored)
    assert_no_server_errors(client, unavailable_ok=True)
    # Once the pool has been checked, requests succeed again.
    assert all(client.call("GET", f"/api/v1/jobs/{job_id}")[0] == 200 for job_id in ids)
