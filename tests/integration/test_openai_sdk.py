"""OpenAI's own Python SDK against the service: daphne, an engine worker subprocess with the real
tiny model, Redis and Postgres. What a user's existing OpenAI client code gets, unchanged but
for ``base_url`` and the key."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import openai
import pytest

from api.common.redis_keys import job_stream_key
from api.jobs.tasks import reconcile_jobs
from api.models import Job, JobStatus
from tests.api.factories import make_api_key
from tests.integration.jobs import wait_status
from tests.integration.procs import START_TIMEOUT_S, free_port, port_open, start_daphne, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MESSAGES = [{"role": "user", "content": "Once upon a time"}]


@pytest.fixture
def base_url(workers, service_env, tmp_path):
    port = free_port()
    daphne = start_daphne(service_env, port, tmp_path, processes=2)
    workers.start("w-openai")

    def up() -> bool:
        assert daphne.alive(), daphne.log_tail()
        return port_open(port)

    wait_for(up, START_TIMEOUT_S, "daphne to listen")
    yield f"http://127.0.0.1:{port}/v1"
    daphne.stop()


def _job(completion_id: str) -> Job:
    return Job.objects.get(id=completion_id.split("-", 1)[1])


def _kill_the_worker_mid_request(request: Callable[[], None], workers, redis_db,
                                 started: Callable[[], bool] = lambda: True) -> Job:
    """Run ``request`` on a thread; once its job streams (and ``started``), ``kill -9`` the worker
    and start another. Returns the job once the new worker completed it and the request ended."""
    thread = threading.Thread(target=request)
    thread.start()
    job = wait_for(lambda: Job.objects.first(), 60, "the request's job")
    wait_for(lambda: redis_db.xlen(job_stream_key(str(job.id))) >= 3 and started(), 120, "the job to stream")
    [first] = workers.procs
    first.kill9()
    workers.start("w-after-kill")
    done = wait_status(str(job.id), (JobStatus.COMPLETED,), tick=reconcile_jobs)
    thread.join(120)
    assert not thread.is_alive(), "the request did not end"
    return done


def test_the_openai_sdk_lists_the_model_chats_streams_and_completes(base_url):
    _key, secret = make_api_key()
    client = openai.OpenAI(base_url=base_url, api_key=secret, max_retries=0, timeout=120)

    assert [m.id for m in client.models.list()] == ["tiny"]

    chat = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24, temperature=0)
    job = _job(chat.id)
    assert job.status == JobStatus.COMPLETED and job.output_text
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == job.output_text
    assert chat.choices[0].finish_reason in {"stop", "length"}
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (job.prompt_tokens, job.completion_tokens)

    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == _job(chunks[0].id).output_text == chat.choices[0].message.content  # greedy: same text
    assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens

    text = client.completions.create(model="tiny", prompt="def fib(n):", max_tokens=8, temperature=0, echo=True)
    assert text.choices[0].text == "def fib(n):" + _job(text.id).output_text
    assert text.usage.completion_tokens == _job(text.id).completion_tokens <= 8

    # OpenAI's logit_bias reaches the real engine: a +100 bias on one token makes every token it.
    forced = client.completions.create(model="tiny", prompt="def fib(n):", max_tokens=6, temperature=0,
                                       logit_bias={"77": 100})
    job = _job(forced.id)
    assert job.completion_tokens == 6 and forced.choices[0].text == job.output_text
    assert job.output_text == "i" * 6  # token 77 of the tiny model's byte-level BPE is "i"

    # Log probabilities from the real engine, through the job's row, in OpenAI's shape.
    scored = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0,
                                            logprobs=True, top_logprobs=2)
    content = scored.choices[0].logprobs.content
    assert len(content) == _job(scored.id).completion_tokens > 0
    for entry in content:  # greedy: the chosen token is the likeliest of its alternatives
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].token == entry.token and entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
    # And streamed: each chunk brings its tokens' entries, the same as the whole answer's (greedy).
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0,
                                            logprobs=True, top_logprobs=2, stream=True)
    streamed = [e for c in stream if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, pytest.approx(e.logprob, abs=1e-4)) for e in content]


def test_the_openai_sdk_raises_its_own_errors_for_what_the_service_refuses(base_url):
    _key, secret = make_api_key(max_tokens_per_job=32)
    client = openai.OpenAI(base_url=base_url, api_key=secret, max_retries=0, timeout=60)

    with pytest.raises(openai.NotFoundError) as not_found:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError) as too_many:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_completion_tokens=64)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base_url, api_key="sk-wrong", max_retries=0).models.list()

    assert not_found.value.code == "model_not_found"
    assert (too_many.value.code, too_many.value.param) == ("max_tokens_too_large", "max_completion_tokens")
    assert Job.objects.count() == 0


def test_sixteen_concurrent_streams_of_the_async_sdk_each_match_their_stored_job(base_url):
    _key, secret = make_api_key()

    async def scenario() -> list[tuple[str, str]]:
        client = openai.AsyncOpenAI(base_url=base_url, api_key=secret, max_retries=0, timeout=300)

        async def one(i: int) -> tuple[str, str]:
            stream = await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": f"Story number {i}:"}], max_tokens=16 + i,
                temperature=0.8, seed=i, stream=True)
            parts, completion_id = [], ""
            async for chunk in stream:
                completion_id = chunk.id
                parts.extend(c.delta.content or "" for c in chunk.choices)
            return completion_id, "".join(parts)

        try:
            return await asyncio.gather(*(one(i) for i in range(16)))
        finally:
            await client.close()

    results = asyncio.run(scenario())

    assert len({completion_id for completion_id, _ in results}) == 16
    for completion_id, streamed in results:
        job = _job(completion_id)
        assert job.status == JobStatus.COMPLETED
        assert streamed == job.output_text


def test_a_completion_whose_worker_is_killed_mid_generation_still_answers_with_the_whole_text(
        base_url, workers, redis_db):
    _key, secret = make_api_key()
    client = openai.OpenAI(base_url=base_url, api_key=secret, max_retries=0, timeout=300)
    answer: dict = {}

    def request() -> None:
        answer["chat"] = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1200,
                                                        temperature=0)

    done = _kill_the_worker_mid_request(request, workers, redis_db)

    chat = answer["chat"]
    assert done.worker_id == "w-after-kill" and done.completion_tokens == 1200
    assert chat.id == f"chatcmpl-{done.id}"
    assert chat.choices[0].message.content == done.output_text
    assert chat.usage.completion_tokens == 1200 and chat.choices[0].finish_reason == "length"


def test_a_greedy_stream_whose_worker_is_killed_goes_on_from_the_new_worker_without_a_seam(
        base_url, workers, redis_db):
    _key, secret = make_api_key()
    client = openai.OpenAI(base_url=base_url, api_key=secret, max_retries=0, timeout=300)
    streamed: list[str] = []
    finish: list[str | None] = []

    def stream() -> None:
        for chunk in client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1200,
                                                    temperature=0, stream=True):
            streamed.extend(c.delta.content or "" for c in chunk.choices)
            finish.extend(c.finish_reason for c in chunk.choices if c.finish_reason)

    done = _kill_the_worker_mid_request(stream, workers, redis_db, started=lambda: bool(streamed))

    assert done.worker_id == "w-after-kill"
    # Greedy: the new attempt wrote the same text, so the client got it once, whole, and the end.
    assert "".join(streamed) == done.output_text
    assert finish == ["length"]
