"""Log probabilities: asked for on a job (REST or OpenAI), written with its final by the worker's
real sink, shown by GET /jobs/<id>, in streamed deltas and in the OpenAI answers."""

from __future__ import annotations

import asyncio
import time

import pytest
from channels.db import database_sync_to_async

from api.jobs.logprobs import chat_logprobs, job_logprobs, text_logprobs
from api.jobs.services import claim as job_claims
from api.jobs.services import outputs as job_outputs
from api.models import Job, JobStatus
from api.serving.tokenization import get_tokenizer
from engine_worker.protocol import FinalResult
from tests.api.factories import make_api_key, make_job
from tests.api.openai_api.client import Exchange, run_job

# Token ids of the tiny model with their own texts (byte-level BPE).
STORED = ((77, -0.25, ((77, -0.25), (42, -2.5))), (42, -1.0, ((42, -1.0), (77, -1.5))))


def _text(token_id: int) -> str:
    return get_tokenizer().decode_tokens([token_id])


@pytest.mark.django_db
def test_the_final_writes_them_and_get_shows_each_tokens_text_id_and_alternatives(api_client, api_key):
    job = make_job(api_key=api_key, status=JobStatus.IN_PROGRESS, worker_id="w",
                   params={"max_tokens": 2, "logprobs": 1})
    result = FinalResult(job_id=str(job.id), text=_text(77) + _text(42), finish_reason="length", prompt_tokens=3,
                         completion_tokens=2, finished_at=time.time(), last_seq=1, logprobs=STORED)

    assert job_outputs.jobs_complete(results=[result], worker_id="w") == [str(job.id)]

    body = api_client.get(f"/api/v1/jobs/{job.id}").json()
    assert body["logprobs"] == [
        {"token": _text(77), "token_id": 77, "logprob": -0.25,
         "top_logprobs": [{"token": _text(77), "token_id": 77, "logprob": -0.25},
                          {"token": _text(42), "token_id": 42, "logprob": -2.5}]},
        {"token": _text(42), "token_id": 42, "logprob": -1.0,
         "top_logprobs": [{"token": _text(42), "token_id": 42, "logprob": -1.0},
                          {"token": _text(77), "token_id": 77, "logprob": -1.5}]},
    ]
    assert job_claims.job_spec(Job.objects.get(id=job.id)).logprobs == 1


@pytest.mark.django_db
def test_a_job_that_did_not_ask_has_none_and_a_delete_clears_them(api_client, api_key):
    plain = make_job(api_key=api_key, status=JobStatus.COMPLETED)
    asked = make_job(api_key=api_key, status=JobStatus.COMPLETED, logprobs=[list(e) for e in STORED])

    assert api_client.get(f"/api/v1/jobs/{plain.id}").json()["logprobs"] is None
    assert api_client.delete(f"/api/v1/jobs/{asked.id}").status_code == 200
    assert Job.objects.get(id=asked.id).logprobs is None


@pytest.mark.django_db
@pytest.mark.parametrize("value", [-1, 21, "2", 1.5, True])
def test_a_bad_logprobs_count_is_400(api_client, value):
    response = api_client.post("/api/v1/jobs", {"prompt": "hi", "logprobs": value}, format="json")

    assert response.status_code == 400 and response.json()["error"]["param"] == "logprobs"


def _exchange(path: str, body: dict):
    """The request's response, with a stand-in worker publishing STORED's two tokens through the
    real sink (each chunk with its entry, the final with both)."""
    api_key, secret = make_api_key()

    async def scenario():
        exchange = Exchange(path, body, secret=secret)
        await exchange.send()
        for _ in range(200):
            job = await database_sync_to_async(Job.objects.filter(owner_id=api_key.owner_id).first)()
            if job is not None:
                break
            await asyncio.sleep(0.02)
        await run_job(str(job.id), [_text(77), _text(42)], finish_reason="length", logprobs=STORED)
        return job, await exchange.read(10)

    job, response = asyncio.run(scenario())
    assert response.status == 200, response.body
    return Job.objects.get(id=job.id), response


def _answer(path: str, body: dict):
    job, response = _exchange(path, body)
    return job, response.json()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("consumer_connections_closed", "redis_client", "dispatched")
def test_an_openai_chat_completion_with_logprobs_answers_them_in_openais_shape():
    job, answer = _answer("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                                   "max_tokens": 2, "logprobs": True, "top_logprobs": 2})

    assert job.params["logprobs"] == 2
    entry = lambda t, lp: {"token": _text(t), "logprob": lp, "bytes": list(_text(t).encode())}  # noqa: E731
    assert answer["choices"][0]["logprobs"] == {"content": [
        {**entry(77, -0.25), "top_logprobs": [entry(77, -0.25), entry(42, -2.5)]},
        {**entry(42, -1.0), "top_logprobs": [entry(42, -1.0), entry(77, -1.5)]},
    ], "refusal": None}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("consumer_connections_closed", "redis_client", "dispatched")
def test_an_openai_text_completion_with_logprobs_answers_tokens_offsets_and_alternatives():
    job, answer = _answer("/v1/completions", {"model": "tiny", "prompt": "Once", "max_tokens": 2, "logprobs": 2})

    assert job.params["logprobs"] == 2
    assert answer["choices"][0]["logprobs"] == {
        "tokens": [_text(77), _text(42)], "token_logprobs": [-0.25, -1.0],
        "top_logprobs": [{_text(77): -0.25, _text(42): -2.5}, {_text(42): -1.0, _text(77): -1.5}],
        "text_offset": [0, len(_text(77))],
    }


def test_tokens_that_split_a_character_report_their_own_bytes_which_join_into_it():
    # "→" is E2 86 92 in UTF-8; the tiny model's byte-level BPE gives each byte a token of its own.
    arrow = get_tokenizer().encode_prompt("→")[-3:]  # after the BOS

    content = chat_logprobs(job_logprobs([(t, -1.0, ((t, -1.0),)) for t in arrow]))["content"]

    assert [bytes(e["bytes"]) for e in content] == [b"\xe2", b"\x86", b"\x92"]
    assert b"".join(bytes(e["bytes"]) for e in content).decode() == "→"
    assert [bytes(e["top_logprobs"][0]["bytes"]) for e in content] == [b"\xe2", b"\x86", b"\x92"]


@pytest.mark.django_db
def test_the_list_leaves_them_out(api_client, api_key):
    job = make_job(api_key=api_key, status=JobStatus.COMPLETED, params={"max_tokens": 2, "logprobs": 1},
                   logprobs=[list(e) for e in STORED])

    listed = api_client.get("/api/v1/jobs").json()["results"]

    assert [(j["id"], j["logprobs"]) for j in listed] == [(str(job.id), None)]
    assert len(api_client.get(f"/api/v1/jobs/{job.id}").json()["logprobs"]) == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("consumer_connections_closed", "redis_client", "dispatched")
def test_a_streamed_chat_completion_sends_each_chunks_log_probabilities():
    _, response = _exchange("/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True,
        "logprobs": True, "top_logprobs": 2})

    chunks = [e for e in response.data_events()[:-1] if e["choices"] and e["choices"][0]["delta"].get("content")]
    entry = lambda t, lp: {"token": _text(t), "logprob": lp, "bytes": list(_text(t).encode())}  # noqa: E731
    assert [c["choices"][0]["logprobs"] for c in chunks] == [
        {"content": [{**entry(77, -0.25), "top_logprobs": [entry(77, -0.25), entry(42, -2.5)]}], "refusal": None},
        {"content": [{**entry(42, -1.0), "top_logprobs": [entry(42, -1.0), entry(77, -1.5)]}], "refusal": None},
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("consumer_connections_closed", "redis_client", "dispatched")
def test_a_streamed_text_completion_sends_tokens_with_offsets_into_the_whole_text():
    _, response = _exchange("/v1/completions", {"model": "tiny", "prompt": "Once", "max_tokens": 2,
                                                     "stream": True, "logprobs": 1})

    chunks = [e for e in response.data_events()[:-1] if e["choices"][0]["text"]]
    assert [c["choices"][0]["logprobs"] for c in chunks] == [
        {"tokens": [_text(77)], "token_logprobs": [-0.25], "top_logprobs": [{_text(77): -0.25, _text(42): -2.5}],
         "text_offset": [0]},
        {"tokens": [_text(42)], "token_logprobs": [-1.0], "top_logprobs": [{_text(42): -1.0, _text(77): -1.5}],
         "text_offset": [len(_text(77))]},
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("consumer_connections_closed")
def test_a_jobs_websocket_replays_each_deltas_log_probabilities_from_its_stream(redis_client):
    from channels.testing import WebsocketCommunicator

    from api.common.redis_keys import job_stream_key
    from api.streaming import messages
    from engine_worker.protocol import OutputChunk
    from inference_service.asgi import application

    api_key, secret = make_api_key()
    job = make_job(api_key=api_key, status=JobStatus.COMPLETED, params={"max_tokens": 2, "logprobs": 1})
    for seq, (entry, token) in enumerate(zip(STORED, (77, 42), strict=True), start=1):
        redis_client.xadd(job_stream_key(str(job.id)), messages.chunk_entry(
            OutputChunk(job_id=str(job.id), seq=seq, text=_text(token), completion_tokens=seq, logprobs=(entry,))))
    redis_client.xadd(job_stream_key(str(job.id)), messages.final_entry(FinalResult(
        job_id=str(job.id), text=_text(77) + _text(42), finish_reason="length", prompt_tokens=3, completion_tokens=2,
        last_seq=2)))

    async def scenario() -> list[dict]:
        communicator = WebsocketCommunicator(application, f"/ws/v1/jobs/{job.id}/?api_key={secret}")
        await communicator.connect(timeout=10)
        received = [await communicator.receive_json_from(timeout=10) for _ in range(3)]
        await communicator.disconnect()
        return received

    deltas = [m for m in asyncio.run(scenario()) if m["type"] == "delta"]

    assert [d["logprobs"] for d in deltas] == [
        [{"token": _text(77), "token_id": 77, "logprob": -0.25,
          "top_logprobs": [{"token": _text(77), "token_id": 77, "logprob": -0.25},
                           {"token": _text(42), "token_id": 42, "logprob": -2.5}]}],
        [{"token": _text(42), "token_id": 42, "logprob": -1.0,
          "top_logprobs": [{"token": _text(42), "token_id": 42, "logprob": -1.0},
                           {"token": _text(77), "token_id": 77, "logprob": -1.5}]}],
    ]



def test_text_offsets_start_where_the_text_does_when_it_dropped_the_first_tokens_space():
    entries = [{"token": " Hello", "logprob": -1.0, "top_logprobs": []},
               {"token": " world", "logprob": -2.0, "top_logprobs": [{"token": " there", "logprob": -0.5}]}]

    out = text_logprobs(entries, text="Hello world")

    assert out["text_offset"] == [0, 5]  # "Hello world"[5:] == " world"
    # OpenAI's legacy top_logprobs always hold the chosen token.
    assert out["top_logprobs"] == [{" Hello": -1.0}, {" world": -2.0, " there": -0.5}]
    assert text_logprobs(entries, text=" world", offset=11)["text_offset"] == [11, 11]  # a later chunk
