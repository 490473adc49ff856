"""``/v1/chat/completions`` and ``/v1/completions`` over the service's jobs: each request is a job,
its answer follows the job's stream (a stand-in worker publishes through the real sink, Redis
stream and channel layer), in OpenAI's shapes."""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async

from api.jobs.services.claim import job_spec
from api.models import Job, JobStatus
from tests.api.factories import make_api_key
from tests.api.openai_api.client import Exchange, run_job

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the consumer's DB calls run on other threads
    pytest.mark.usefixtures("consumer_connections_closed", "redis_client", "dispatched"),
]

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"


@database_sync_to_async
def _job_of(owner_id: int) -> Job | None:
    return Job.objects.filter(owner_id=owner_id).order_by("created_at").last()


async def _job_created(owner_id: int, count: int = 1) -> Job:
    """The owner's newest job, once ``count`` exist (the consumer creates it on a thread)."""
    for _ in range(200):
        if await database_sync_to_async(Job.objects.filter(owner_id=owner_id).count)() >= count:
            return await _job_of(owner_id)
        await asyncio.sleep(0.02)
    raise AssertionError("no job was created")


def _exchange_with_worker(path: str, body: dict, texts: list[str], *, headers=(), timeout: float = 10, **final):
    api_key, secret = make_api_key()

    async def scenario():
        exchange = Exchange(path, body, secret=secret, headers=list(headers))
        await exchange.send()
        job = await _job_created(api_key.owner_id)
        await run_job(str(job.id), texts, **final)
        return job, await exchange.read(timeout)

    job, response = asyncio.run(scenario())
    return Job.objects.get(id=job.id), response


def test_a_chat_completion_answers_when_its_job_ends_with_the_stored_text_and_the_engines_usage():
    body = {"model": "tiny", "messages": [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": [{"type": "text", "text": "Say hi"}]}],
            "max_completion_tokens": 12, "seed": 7, "presence_penalty": 0.5, "frequency_penalty": -0.5,
            "logit_bias": {"7": -100, "42": 3.5}, "metadata": {"conversation": "c-1"}}

    job, response = _exchange_with_worker(CHAT, body, ["Hello", ",", " world"], cached_tokens=2)

    assert response.status == 200
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-job-id"] == str(job.id)
    assert response.headers["x-ratelimit-remaining"].isdigit()
    answer = response.json()
    assert answer["id"] == f"chatcmpl-{job.id}" and answer["object"] == "chat.completion"
    assert answer["model"] == "tiny" and answer["created"] == int(job.created_at.timestamp())
    assert answer["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hello, world"},
                                  "logprobs": None, "finish_reason": "stop"}]
    assert answer["usage"] == {"prompt_tokens": len(job.prompt_token_ids), "completion_tokens": 3,
                               "total_tokens": len(job.prompt_token_ids) + 3,
                               "prompt_tokens_details": {"cached_tokens": 2}}
    # The job is an ordinary job of the service, with OpenAI's defaults where the body was silent.
    assert job.status == JobStatus.COMPLETED and job.output_text == "Hello, world"
    assert job.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]
    assert (job.params["max_tokens"], job.params["seed"], job.params["temperature"], job.params["top_p"]) == (
        12, 7, 1.0, 1.0)
    assert job.metadata == {"conversation": "c-1"}
    # OpenAI's penalties and logit bias reach the engine's spec of the job.
    assert (job.params["presence_penalty"], job.params["frequency_penalty"]) == (0.5, -0.5)
    spec = job_spec(job)
    assert (spec.presence_penalty, spec.frequency_penalty, spec.logit_bias) == (0.5, -0.5, ((7, -100.0), (42, 3.5)))


def test_a_streamed_chat_completion_sends_the_role_each_chunk_the_finish_and_the_usage_then_done():
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0}

    job, response = _exchange_with_worker(CHAT, body, ["Once", " upon", " a"], finish_reason="length")

    assert response.status == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-job-id"] == str(job.id)
    events = response.data_events()
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {c["id"] for c in chunks} == {f"chatcmpl-{job.id}"}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert [c["choices"][0]["delta"] for c in chunks[:-2]] == [
        {"role": "assistant", "content": ""}, {"content": "Once"}, {"content": " upon"}, {"content": " a"}]
    assert all(c["usage"] is None and c["choices"][0]["finish_reason"] is None for c in chunks[:-2])
    assert chunks[-2]["choices"] == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == job.output_text


def test_a_model_that_stops_at_once_gives_the_same_empty_answer_streamed_waited_for_and_stored():
    """Its first token is the stop token: no text and no completion token (the stop token is
    neither), alike in the stream, the waited-for body and the job's row."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0}

    job, waited = _exchange_with_worker(CHAT, body, [])
    streamed_job, streamed = _exchange_with_worker(
        CHAT, {**body, "stream": True, "stream_options": {"include_usage": True}}, [])

    assert waited.json()["choices"][0]["message"]["content"] == ""
    assert waited.json()["choices"][0]["finish_reason"] == "stop"
    assert waited.json()["usage"]["completion_tokens"] == 0
    chunks = streamed.data_events()[:-1]
    assert [c["choices"][0]["delta"] for c in chunks[:-1]] == [{"role": "assistant", "content": ""}, {}]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and chunks[-1]["usage"]["completion_tokens"] == 0
    for row in (job, streamed_job):
        assert (row.status, row.output_text, row.completion_tokens) == (JobStatus.COMPLETED, "", 0)


def test_a_text_completion_with_echo_starts_with_the_prompt_and_defaults_to_16_tokens():
    body = {"model": "tiny", "prompt": ["Once upon a time"], "echo": True}

    job, response = _exchange_with_worker(TEXT, body, [" there", " was"])

    answer = response.json()
    assert response.status == 200
    assert answer["id"] == f"cmpl-{job.id}" and answer["object"] == "text_completion"
    assert answer["choices"] == [{"index": 0, "text": "Once upon a time there was", "logprobs": None,
                                  "finish_reason": "stop"}]
    assert job.prompt == "Once upon a time" and job.params["max_tokens"] == 16


def test_a_streamed_text_completion_sends_text_chunks_without_usage_unless_asked():
    body = {"model": "tiny", "prompt": "Once upon a time", "stream": True, "max_tokens": 4}

    job, response = _exchange_with_worker(TEXT, body, [" there", " was"])

    events = response.data_events()
    assert events[-1] == "[DONE]"
    assert [c["choices"][0]["text"] for c in events[:-1]] == [" there", " was", ""]
    assert [c["choices"][0]["finish_reason"] for c in events[:-1]] == [None, None, "stop"]
    assert all("usage" not in c and c["object"] == "text_completion" for c in events[:-1])


def test_a_failed_job_is_a_502_error_or_a_last_error_event_in_a_stream():
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}

    plain_job, plain = _exchange_with_worker(CHAT, body, [], finish_reason="error", error="out of memory")
    streamed_job, streamed = _exchange_with_worker(CHAT, {**body, "stream": True}, ["a"], finish_reason="error",
                                                   error="out of memory")

    assert plain.status == 502 and plain.headers["x-job-id"] == str(plain_job.id)
    error = plain.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "job_failed") and "out of memory" in error["message"]
    events = streamed.data_events()
    assert streamed.status == 200 and events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "job_failed"
    assert streamed_job.status == JobStatus.FAILED


def test_a_client_that_goes_away_cancels_its_job():
    api_key, secret = make_api_key()

    async def scenario() -> Job:
        exchange = Exchange(CHAT, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True},
                            secret=secret)
        await exchange.send()
        job = await _job_created(api_key.owner_id)
        assert (await exchange.start())["status"] == 200
        await exchange.disconnect()
        return job

    job = asyncio.run(scenario())

    assert Job.objects.get(id=job.id).status == JobStatus.CANCELLED


def test_with_an_idempotency_key_the_job_outlives_the_client_and_a_retry_follows_the_same_job():
    api_key, secret = make_api_key()
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    key = [(b"idempotency-key", b"retry-1")]

    async def scenario():
        first = Exchange(CHAT, body, secret=secret, headers=key)
        await first.send()
        job = await _job_created(api_key.owner_id)
        await first.disconnect()  # e.g. the client's timeout
        retry = Exchange(CHAT, body, secret=secret, headers=key)
        await retry.send()
        await asyncio.sleep(0.2)
        await run_job(str(job.id), ["Hi", " there"])
        return job, await retry.read()

    job, response = asyncio.run(scenario())

    assert Job.objects.count() == 1
    assert response.status == 200 and response.json()["id"] == f"chatcmpl-{job.id}"
    assert response.json()["choices"][0]["message"]["content"] == "Hi there"


def test_a_job_cancelled_elsewhere_ends_the_request_with_a_409():
    api_key, secret = make_api_key()

    async def scenario():
        exchange = Exchange(TEXT, {"model": "tiny", "prompt": "Once"}, secret=secret)
        await exchange.send()
        job = await _job_created(api_key.owner_id)
        from api.jobs.services.cancel import job_cancel

        await database_sync_to_async(job_cancel)(job_id=str(job.id), owner=api_key.owner)
        return await exchange.read()

    response = asyncio.run(scenario())

    assert response.status == 409 and response.json()["error"]["code"] == "job_cancelled"


def test_an_over_quota_key_gets_a_429_with_retry_after():
    api_key, secret = make_api_key(max_concurrent_jobs=1)
    body = {"model": "tiny", "prompt": "Once"}

    async def scenario():
        first = Exchange(TEXT, body, secret=secret)
        await first.send()
        await _job_created(api_key.owner_id)
        second = Exchange(TEXT, body, secret=secret)
        await second.send()
        refused = await second.read()
        await first.disconnect()
        return refused

    refused = asyncio.run(scenario())

    assert refused.status == 429 and refused.json()["error"]["type"] == "rate_limit_error"
    assert int(refused.headers["retry-after"]) >= 1
    assert Job.objects.count() == 1


def _restarted_stream(second_attempt: list[str]):
    """A streamed chat whose job streams "Once", then restarts on another worker, whose attempt
    streams ``second_attempt`` and finishes. Returns the job and the response."""
    from api.common.redis_client import get_redis
    from api.jobs.services.claim import job_claim
    from api.worker.admission import stream_restart
    from api.worker.sink import RedisJobSink
    from engine_worker.protocol import FinalResult, OutputChunk, StepBatch
    from tests.api.openai_api.client import WORKER

    api_key, secret = make_api_key()

    @database_sync_to_async
    def publish(job_id: str, worker: str, texts: list[str], *, claim: bool = False, final: bool = False) -> None:
        """What a worker does: claim (a job that ran before restarts its stream), stream, finish."""
        first = 1
        if claim:
            job = job_claim(job_id=job_id, worker_id=worker, lease_s=30)
            if job.attempts > 1:
                first = stream_restart(redis_client=get_redis(), job=job)
        sink = RedisJobSink(worker_id=worker, redis_client=get_redis())
        sink.publish(StepBatch(chunks=tuple(
            OutputChunk(job_id=job_id, seq=first + i, text=t, completion_tokens=i + 1) for i, t in enumerate(texts))))
        if final:
            sink.publish(StepBatch(finals=(FinalResult(
                job_id=job_id, text="".join(texts), finish_reason="stop", prompt_tokens=3,
                completion_tokens=len(texts), last_seq=first + len(texts) - 1),)))

    async def scenario():
        exchange = Exchange(CHAT, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                   "stream": True}, secret=secret)
        await exchange.send()
        job = await _job_created(api_key.owner_id)
        await publish(str(job.id), WORKER, ["Once"], claim=True)
        seen = b""
        while b"Once" not in seen:
            seen += await exchange.next_body()
        # The first worker died; the job was handed on and another worker starts it from scratch.
        from api.jobs.services.lifecycle import job_hand_back

        await database_sync_to_async(job_hand_back)(job_id=str(job.id), worker_id=WORKER, redispatch_after_s=0)
        await publish(str(job.id), "w-second", second_attempt, claim=True, final=True)
        return job, await exchange.read()

    job, response = asyncio.run(scenario())
    return Job.objects.get(id=job.id), response.data_events()


def test_a_stream_whose_job_restarts_and_writes_the_same_text_goes_on_without_repeating_it():
    job, events = _restarted_stream(["Once", " upon", " a time"])

    assert events[-1] == "[DONE]"
    deltas = [e["choices"][0]["delta"] for e in events[:-1]]
    assert deltas == [{"role": "assistant", "content": ""}, {"content": "Once"}, {"content": " upon"},
                      {"content": " a time"}, {}]
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert job.status == JobStatus.COMPLETED and job.output_text == "Once upon a time"


def test_a_stream_whose_job_restarts_and_writes_other_text_ends_with_an_error_and_the_job_goes_on():
    job, events = _restarted_stream(["Twice", " upon"])

    assert [e["choices"][0]["delta"] for e in events[:2]] == [{"role": "assistant", "content": ""}, {"content": "Once"}]
    assert events[-2]["error"]["code"] == "stream_restarted" and str(job.id) in events[-2]["error"]["message"]
    assert events[-1] == "[DONE]"
    assert job.output_text == "Twice upon"  # the new attempt's text, in the row


def test_an_idle_stream_gets_keep_alive_comments(settings):
    settings.SSE_KEEPALIVE_S = 0.05
    api_key, secret = make_api_key()

    async def scenario() -> bytes:
        exchange = Exchange(TEXT, {"model": "tiny", "prompt": "Once", "stream": True}, secret=secret)
        await exchange.send()
        await _job_created(api_key.owner_id)
        body = b""
        for _ in range(50):
            body += await exchange.next_body()
            if b": keep-alive" in body:
                break
        await exchange.disconnect()
        return body

    assert b": keep-alive\n\n" in asyncio.run(scenario())


def test_with_the_streams_redis_unreachable_a_waiting_request_still_answers_from_the_row(monkeypatch):
    import redis.asyncio as aioredis

    from api.streaming import follow as follow_module
    from api.streaming import relay as relay_module

    monkeypatch.setattr(relay_module, "BLOCK_S", 0.05)  # the relay's checks of the row, sooner
    dead = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2, retry=None)  # nothing listens
    monkeypatch.setattr(follow_module, "get_async_redis", lambda: dead)

    job, response = _exchange_with_worker(CHAT, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
                                          ["Hello", " again"], timeout=30)

    assert response.status == 200
    assert response.json()["choices"][0]["message"]["content"] == "Hello again" == job.output_text
