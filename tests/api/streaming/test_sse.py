"""GET /api/v1/jobs/<id>/events: a job's stream as server-sent events, through the real ASGI
application, Redis and the channel layer."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.testing import ApplicationCommunicator

from api.common.redis_keys import job_stream_key
from api.models import JobStatus
from api.streaming import messages
from engine_worker.protocol import FinalResult, OutputChunk
from inference_service.asgi import application
from tests.api.factories import make_api_key, make_job

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the consumer's DB calls run on other threads
    pytest.mark.usefixtures("consumer_connections_closed"),
]

TEXTS = ["Once", " upon", " a", " time"]


def _chunk(job_id: str, seq: int) -> dict[str, str]:
    return messages.chunk_entry(OutputChunk(job_id=job_id, seq=seq, text=TEXTS[seq - 1], completion_tokens=seq))


def _final(job_id: str, last_seq: int) -> FinalResult:
    return FinalResult(job_id=job_id, text="".join(TEXTS[:last_seq]), finish_reason="length", prompt_tokens=3,
                       completion_tokens=last_seq, last_seq=last_seq)


def _finished_job(redis_client, api_key, n: int = 3) -> str:
    job_id = str(make_job(api_key=api_key, status=JobStatus.COMPLETED).id)
    for seq in range(1, n + 1):
        redis_client.xadd(job_stream_key(job_id), _chunk(job_id, seq))
    redis_client.xadd(job_stream_key(job_id), messages.final_entry(_final(job_id, n)))
    return job_id


def _scope(path: str, *, secret: str | None, method: str = "GET", query: str = "",
           headers: list[tuple[bytes, bytes]] = ()) -> dict:
    auth = [(b"authorization", f"Bearer {secret}".encode())] if secret else []
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
            "headers": [(b"host", b"localhost"), *auth, *headers], "client": ("127.0.0.1", 1), "server": ("localhost", 80)}


class Response:
    def __init__(self, start: dict, chunks: list[bytes]) -> None:
        self.status = start["status"]
        self.headers = {k.decode(): v.decode() for k, v in start["headers"]}
        self.body = b"".join(chunks)

    def events(self) -> list[dict]:
        """The body's events as {"id", "event", "data"} (data parsed), comments as {"comment"}."""
        out = []
        for block in self.body.decode().split("\n\n"):
            if not block:
                continue
            fields: dict = {}
            for line in block.split("\n"):
                name, _, value = line.partition(": ")
                if line.startswith(":"):
                    fields["comment"] = line[1:].strip()
                else:
                    fields[name] = json.loads(value) if name == "data" else value
            out.append(fields)
        return out


async def _open(scope: dict) -> tuple[ApplicationCommunicator, dict]:
    communicator = ApplicationCommunicator(application, scope)
    await communicator.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await communicator.receive_output(timeout=10)
    assert start["type"] == "http.response.start"
    return communicator, start


async def _read_to_end(communicator: ApplicationCommunicator, start: dict) -> Response:
    chunks = []
    while True:
        message = await communicator.receive_output(timeout=10)
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            await communicator.send_input({"type": "http.disconnect"})  # as daphne does at the end
            await communicator.wait(timeout=10)
            return Response(start, chunks)


def get(scope: dict) -> Response:
    async def run() -> Response:
        communicator, start = await _open(scope)
        return await _read_to_end(communicator, start)

    return asyncio.run(run())


def _deltas(response: Response) -> list[tuple[str, int, str]]:
    return [(e["id"], e["data"]["seq"], e["data"]["text"]) for e in response.events() if e.get("event") == "delta"]


def test_a_finished_job_streams_every_chunk_in_order_then_the_final_and_the_response_ends(redis_client):
    api_key, secret = make_api_key()
    job_id = _finished_job(redis_client, api_key)

    response = get(_scope(f"/api/v1/jobs/{job_id}/events", secret=secret))

    assert response.status == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    events = response.events()
    assert events[0] == {"retry": "1000"}
    assert _deltas(response) == [("1", 1, "Once"), ("2", 2, " upon"), ("3", 3, " a")]
    assert events[-1]["event"] == "final" and events[-1]["id"] == "3:final"
    assert events[-1]["data"]["status"] == "completed" and events[-1]["data"]["usage"]["completion_tokens"] == 3
    # The same message bodies as the WebSocket's.
    assert events[1]["data"] == messages.delta_message(job_id, 1, "Once", 1)


def test_after_and_last_event_id_resume_after_that_chunk(redis_client):
    api_key, secret = make_api_key()
    job_id = _finished_job(redis_client, api_key)
    path = f"/api/v1/jobs/{job_id}/events"

    assert [s for _, s, _ in _deltas(get(_scope(path, secret=secret, query="after=1")))] == [2, 3]
    assert [s for _, s, _ in _deltas(get(_scope(path, secret=secret, headers=[(b"last-event-id", b"2")])))] == [3]
    # The header is a reconnecting EventSource's own state: it wins over the URL's after=.
    resumed = get(_scope(path, secret=secret, query="after=0", headers=[(b"last-event-id", b"3")]))
    assert _deltas(resumed) == [] and resumed.events()[-1]["event"] == "final"
    # An empty header is no event id (an EventSource with none sends no header): after= applies.
    empty = get(_scope(path, secret=secret, query="after=1", headers=[(b"last-event-id", b"")]))
    assert empty.status == 200 and [s for _, s, _ in _deltas(empty)] == [2, 3]


def test_a_reconnect_after_the_final_is_204_so_an_event_source_stops(redis_client):
    api_key, secret = make_api_key()
    job_id = _finished_job(redis_client, api_key)
    response = get(_scope(f"/api/v1/jobs/{job_id}/events", secret=secret, headers=[(b"last-event-id", b"3:final")]))
    assert response.status == 204 and response.body == b""


def test_live_chunks_and_the_final_arrive_as_the_worker_publishes_them(redis_client):
    api_key, secret = make_api_key()
    job_id = str(make_job(api_key=api_key, status=JobStatus.IN_PROGRESS).id)
    redis_client.xadd(job_stream_key(job_id), _chunk(job_id, 1))  # produced before the client came

    async def scenario() -> Response:
        communicator, start = await _open(_scope(f"/api/v1/jobs/{job_id}/events", secret=secret, query=f"api_key={secret}"))
        chunks = [(await communicator.receive_output(timeout=10))["body"] for _ in range(2)]  # retry, chunk 1
        for seq in (2, 3):  # live, as the worker's sink writes them
            redis_client.xadd(job_stream_key(job_id), _chunk(job_id, seq))
            chunks.append((await communicator.receive_output(timeout=10))["body"])
        redis_client.xadd(job_stream_key(job_id), messages.final_entry(_final(job_id, 3)))
        rest = await _read_to_end(communicator, start)
        return Response(start, [*chunks, rest.body])

    response = asyncio.run(scenario())
    assert _deltas(response) == [("1", 1, "Once"), ("2", 2, " upon"), ("3", 3, " a")]
    assert [e.get("event") for e in response.events()][-1] == "final"


def test_a_quiet_stream_sends_keep_alive_comments(redis_client, settings):
    settings.SSE_KEEPALIVE_S = 0.05
    api_key, secret = make_api_key()
    job_id = str(make_job(api_key=api_key).id)  # queued: nothing to send yet

    async def scenario() -> list[bytes]:
        communicator, _ = await _open(_scope(f"/api/v1/jobs/{job_id}/events", secret=secret))
        bodies = [(await communicator.receive_output(timeout=10))["body"] for _ in range(3)]
        await communicator.send_input({"type": "http.disconnect"})  # the client goes away
        await communicator.wait(timeout=10)
        return bodies

    bodies = asyncio.run(scenario())
    assert bodies == [b"retry: 1000\n\n", b": keep-alive\n\n", b": keep-alive\n\n"]


def _error(response: Response) -> dict:
    assert response.headers["content-type"] == "application/json"
    error = json.loads(response.body)["error"]
    assert set(error) == {"message", "type", "code", "param"}
    return error


def test_errors_before_the_stream_are_the_apis_envelope(redis_client):
    api_key, secret = make_api_key()
    job_id = _finished_job(redis_client, api_key)
    path = f"/api/v1/jobs/{job_id}/events"

    missing = get(_scope(path, secret=None))
    assert missing.status == 401 and _error(missing)["code"] == "missing_api_key"
    assert missing.headers["www-authenticate"] == 'Bearer realm="api"'
    assert _error(get(_scope(path, secret="sk-nope")))["code"] == "invalid_api_key"

    _, other = make_api_key()  # another user's key: not their job
    not_theirs = get(_scope(path, secret=other))
    assert not_theirs.status == 404 and _error(not_theirs)["code"] == "job_not_found"

    after_message = "'after' must be a non-negative integer."
    header_message = "'Last-Event-ID' must be an event id of this stream."
    for query, headers, param, message in (
            ("after=-1", [], "after", after_message), ("after=abc", [], "after", after_message),
            ("after=%C2%B2", [], "after", after_message),
            ("", [(b"last-event-id", b"x:final")], "Last-Event-ID", header_message)):
        bad = get(_scope(path, secret=secret, query=query, headers=headers))
        assert bad.status == 400 and _error(bad)["code"] == "invalid_after"
        assert (_error(bad)["param"], _error(bad)["message"]) == (param, message)

    post = get(_scope(path, secret=secret, method="POST"))
    assert post.status == 405 and post.headers["allow"] == "GET"


def test_other_http_paths_still_reach_django(redis_client):
    api_key, secret = make_api_key()
    job_id = _finished_job(redis_client, api_key)
    detail = get(_scope(f"/api/v1/jobs/{job_id}", secret=secret))
    assert detail.status == 200 and json.loads(detail.body)["id"] == job_id
    unknown = get(_scope(f"/api/v1/jobs/{job_id}/events/more", secret=secret))
    assert unknown.status == 404 and json.loads(unknown.body)["error"]["code"] == "not_found"


def test_without_redis_the_stream_is_a_503_before_any_event(redis_client, monkeypatch):
    import redis.asyncio
    import redis.exceptions

    api_key, secret = make_api_key()
    job_id = _finished_job(redis_client, api_key)

    async def down(*_args, **_kwargs):
        raise redis.exceptions.ConnectionError("Redis is down")

    monkeypatch.setattr(redis.asyncio.Redis, "xread", down)
    response = get(_scope(f"/api/v1/jobs/{job_id}/events", secret=secret))
    assert response.status == 503 and response.headers["retry-after"] == "1"
    assert _error(response)["code"] == "service_unavailable"
