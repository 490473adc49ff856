"""Drill: a job whose output is full of NUL (PostgreSQL's text refuses it) next to 8 ordinary jobs.
Every job completes, and the NUL job's text is the same over REST, its WebSocket, server-sent
events and the OpenAI door."""

from __future__ import annotations

import asyncio

import pytest

from tests.drills.checks import assert_all_completed, assert_no_server_errors, assert_streams_match
from tests.drills.client import DrillClient

pytestmark = [pytest.mark.drill, pytest.mark.slow, pytest.mark.timeout(300)]


def test_a_job_generating_nul_completes_next_to_ordinary_jobs_with_the_same_text_everywhere(stack, tokens):
    stack.ensure_workers(1)
    client = DrillClient(stack.port, stack.user_keys()[0])
    nul_body = {"prompt": "Zero bytes:", "max_tokens": 24, "temperature": 0.0,
                "logit_bias": {str(tokens["nul"]): 100}}
    ordinary = [{"prompt": f"Ordinary job {i}:", "max_tokens": 24, "temperature": 0.0,
                 "logit_bias": {str(tokens["eos"]): -100}} for i in range(8)]

    async def scenario():
        nul_id, nul_followed = await client.generate(nul_body, timeout=90)
        ids = await asyncio.gather(*(client.submit(body) for body in ordinary))
        followed = await asyncio.gather(*(client.follow(job_id, timeout=90) for job_id in ids))
        return nul_id, nul_followed, ids, followed

    nul_id, nul_followed, ids, followed = asyncio.run(scenario())
    assert nul_id is not None, nul_followed.error
    stored = asyncio.run(client.poll_all([nul_id, *ids], timeout=60))

    assert_all_completed(stored, [nul_id, *ids], {job_id: 24 for job_id in [nul_id, *ids]})
    assert stored[nul_id]["output_text"] == "\x00" * 24
    assert_streams_match({nul_id: nul_followed, **dict(zip(ids, followed, strict=True))}, stored)
    sse_text, sse_final = client.sse_text(nul_id)
    assert (sse_text, sse_final["status"]) == (stored[nul_id]["output_text"], "completed")
    status, openai = client.call("POST", "/v1/completions", {"model": "tiny", **nul_body})
    assert status == 200, openai
    assert openai["choices"][0]["text"] == "\x00" * 24
    assert_no_server_errors(client)
