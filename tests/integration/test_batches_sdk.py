"""OpenAI's Files and Batch APIs through OpenAI's own SDK, against the real stack: daphne, an
engine worker with the tiny model, the light Celery worker (which starts, feeds and ends
batches), Redis and Postgres. Beat's periodic tasks (``reconcile_jobs``, ``tick_batches``) run
in the test's polling loop, as in the other integration tests."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator

import openai
import pytest
from standardwebhooks.webhooks import Webhook

from api.batches.tasks import tick_batches
from api.common.redis_keys import job_stream_key
from api.jobs.tasks import reconcile_jobs
from api.models import ApiKey, Job
from tests.api.factories import make_api_key
from tests.api.webhooks.receiver import WebhookReceiver
from tests.integration.procs import (
    START_TIMEOUT_S,
    celery_ready,
    free_port,
    port_open,
    start_celery_workers,
    start_daphne,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CAP = 3  # batch jobs of a key in the engine at once: small, so a batch of a few lines takes turns


@pytest.fixture
def stack(workers, service_env, tmp_path, settings) -> Iterator[str]:
    """daphne, the light worker and an engine worker on one files folder (this process's beat
    tasks too); yields the /v1 URL."""
    files = {"location": str(tmp_path / "files")}
    # Loopback webhooks allowed: a batch's end is announced to a receiver in this process.
    service_env.update(FILES_STORAGE_OPTIONS=json.dumps(files), BATCH_JOBS_IN_FLIGHT_PER_KEY=str(CAP),
                       WEBHOOK_ALLOWED_NETWORKS="127.0.0.0/8")
    settings.WEBHOOK_ALLOWED_NETWORKS = (ipaddress.ip_network("127.0.0.0/8"),)
    # pytest-django's settings fixture: Django then drops its storages built from the old value.
    settings.STORAGES = {**settings.STORAGES, "files": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": files}}
    settings.BATCH_JOBS_IN_FLIGHT_PER_KEY = CAP
    port = free_port()
    daphne = start_daphne(service_env, port, tmp_path)
    light, hooks = start_celery_workers(service_env, tmp_path)
    workers.start("w-batch")

    def up() -> bool:
        assert daphne.alive(), daphne.log_tail()
        return port_open(port)

    wait_for(up, START_TIMEOUT_S, "daphne to listen")
    wait_for(lambda: celery_ready(light) and celery_ready(hooks), START_TIMEOUT_S, "the Celery workers")
    yield f"http://127.0.0.1:{port}/v1"
    hooks.stop()
    light.stop()
    daphne.stop()


def _client(base_url: str) -> openai.OpenAI:
    _key, secret = make_api_key()
    return openai.OpenAI(base_url=base_url, api_key=secret, max_retries=0, timeout=120)


def _lines(n: int, max_tokens: int) -> list[dict]:
    return [{"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "tiny", "messages": [{"role": "user", "content": f"Story number {i}:"}],
                      "max_tokens": max_tokens, "temperature": 0}} for i in range(n)]


def _start(client: openai.OpenAI, lines: list[dict], **extra) -> str:
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    file = client.files.create(file=("input.jsonl", data), purpose="batch")
    assert (file.object, file.purpose, file.bytes) == ("file", "batch", len(data))
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h",
                                  **extra)
    assert batch.status == "validating" and batch.input_file_id == file.id
    return batch.id


def _ticked(check):
    """``check`` with beat's periodic tasks run first."""
    def run():
        reconcile_jobs()
        tick_batches()
        return check()
    return run


def _wait_ended(client: openai.OpenAI, batch_id: str, timeout: float = 600):
    def ended():
        batch = client.batches.retrieve(batch_id)
        return batch if batch.status in ("completed", "failed", "expired", "cancelled") else None
    return wait_for(_ticked(ended), timeout, f"batch {batch_id} to end", interval=0.5)


def _file_lines(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).content.splitlines()]


def test_a_batch_runs_through_the_sdk_and_its_output_answers_as_the_online_endpoint(stack):
    api_key, secret = make_api_key()
    client = openai.OpenAI(base_url=stack, api_key=secret, max_retries=0, timeout=120)
    lines = _lines(7, max_tokens=12)
    with WebhookReceiver() as receiver:
        batch_id = _start(client, lines, metadata={"run": "sdk"}, extra_body={"webhook_url": receiver.url})
        batch = _wait_ended(client, batch_id)
        hooks = receiver.wait_for(1, 60)

    [hook] = hooks  # the light worker announced the batch's end once, signed with the key's secret
    event = Webhook(ApiKey.objects.get(id=api_key.id).webhook_secret).verify(hook.body, hook.headers)
    assert event["type"] == "batch.completed" and event["data"]["id"] == batch_id
    assert event["data"]["output_file_id"] == batch.output_file_id

    assert batch.status == "completed" and batch.metadata == {"run": "sdk"}
    assert batch.request_counts.total == 7 and batch.request_counts.completed == 7
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at and batch.error_file_id is None
    output = _file_lines(client, batch.output_file_id)
    assert sorted(line["custom_id"] for line in output) == sorted(line["custom_id"] for line in lines)
    online = client.chat.completions.create(**lines[3]["body"])
    [third] = [line for line in output if line["custom_id"] == "req-3"]
    body = third["response"]["body"]
    assert third["response"]["status_code"] == 200 and third["error"] is None
    assert body["object"] == "chat.completion" and body["model"] == "tiny"
    assert body["choices"][0]["message"]["content"] == online.choices[0].message.content  # greedy: same text
    assert body["usage"]["prompt_tokens"] == online.usage.prompt_tokens
    assert body["id"] == f"chatcmpl-{third['response']['request_id']}"
    assert [b.id for b in client.batches.list(limit=5)] == [batch_id]
    assert client.files.retrieve(batch.output_file_id).purpose == "batch_output"
    assert client.files.delete(batch.output_file_id).deleted
    assert client.batches.retrieve(batch_id).output_file_id is None


def test_a_bad_file_is_refused_and_another_users_batch_is_not_found(stack):
    client = _client(stack)
    bad = [*_lines(2, 4), {"custom_id": "x", "method": "GET", "url": "/v1/chat/completions", "body": {}}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.files.create(file=("bad.jsonl", "".join(json.dumps(line) + "\n" for line in bad).encode()),
                            purpose="batch")
    assert "line 3: method" in caught.value.message

    batch_id = _start(client, _lines(1, 2))
    other = _client(stack)
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(batch_id)
    with pytest.raises(openai.NotFoundError):
        other.batches.cancel(batch_id)
    _wait_ended(client, batch_id)


def test_a_batch_cancelled_midway_ends_cancelled_with_each_line_once(stack):
    client = _client(stack)
    lines = _lines(3 * CAP, max_tokens=300)
    batch_id = _start(client, lines)
    wait_for(_ticked(lambda: client.batches.retrieve(batch_id).request_counts.completed >= 1), 600,
             "a first line to complete", interval=0.5)

    assert client.batches.cancel(batch_id).status in ("cancelling", "cancelled")
    batch = _wait_ended(client, batch_id, timeout=120)

    assert batch.status == "cancelled" and batch.cancelled_at
    output, errors = _file_lines(client, batch.output_file_id), _file_lines(client, batch.error_file_id)
    assert 1 <= len(output) < len(lines)
    assert sorted(line["custom_id"] for line in output + errors) == sorted(line["custom_id"] for line in lines)
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}


def test_a_batch_survives_a_kill_9_of_its_engine_worker(stack, workers, redis_db):
    client = _client(stack)
    lines = _lines(2 * CAP, max_tokens=400)
    batch_id = _start(client, lines)
    running = wait_for(_ticked(lambda: Job.objects.filter(batch_id=batch_id, status="in_progress").first()), 300,
                       "a batch job to run", interval=0.5)
    wait_for(lambda: redis_db.xlen(job_stream_key(str(running.id))) >= 3, 120, "it to stream")

    [first] = workers.procs
    first.kill9()
    # The jobs the dead worker held (the one seen streaming may have finished just before).
    interrupted = list(Job.objects.filter(batch_id=batch_id, status="in_progress").values_list("id", flat=True))
    assert interrupted, "no job of the batch was running when its worker was killed"
    workers.start("w-after-kill")
    batch = _wait_ended(client, batch_id)

    assert batch.status == "completed" and batch.request_counts.completed == len(lines)
    output = _file_lines(client, batch.output_file_id)
    assert sorted(line["custom_id"] for line in output) == sorted(line["custom_id"] for line in lines)
    assert set(Job.objects.filter(id__in=interrupted).values_list("attempts", flat=True)) == {2}


def test_a_batch_survives_a_redis_flush_in_its_middle(stack, redis_db):
    client = _client(stack)
    lines = _lines(3 * CAP, max_tokens=100)
    batch_id = _start(client, lines)
    wait_for(_ticked(lambda: client.batches.retrieve(batch_id).request_counts.completed >= 1), 300,
             "a first line to complete", interval=0.5)

    redis_db.flushdb()  # the queued messages, the streams and the light worker's own messages go
    batch = _wait_ended(client, batch_id)

    assert batch.status == "completed" and batch.request_counts.completed == len(lines)
    output = _file_lines(client, batch.output_file_id)
    assert sorted(line["custom_id"] for line in output) == sorted(line["custom_id"] for line in lines)
