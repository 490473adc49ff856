"""``/v1/batches`` and the batch's way through its services, without an engine: create, start
(lines become held jobs), the feeder, the end (files built from the jobs' rows), cancel, paging,
and each user seeing only their own batches."""

from __future__ import annotations

import json

import pytest
from django.core.files.storage import storages
from rest_framework.test import APIClient

from api.batches.feed import BATCH_PROGRESS_TASK, batch_feed
from api.batches.models import Batch, BatchStatus, File
from api.batches.services import START_BATCH_TASK, batch_advance, batch_start
from api.batches.tasks import tick_batches
from api.models import Job, JobStatus
from api.webhooks.models import WebhookDelivery
from tests.api.batches.helpers import chat_line, finish, upload
from tests.api.factories import make_api_key


@pytest.fixture(autouse=True)
def files_dir(settings, tmp_path):
    settings.STORAGES = {**settings.STORAGES, "files": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "files")}}}


def _file(client: APIClient, lines: list) -> str:
    response = client.post("/v1/files", {"file": upload(lines), "purpose": "batch"}, format="multipart")
    assert response.status_code == 200, response.json()
    return response.json()["id"]


def _batch(client: APIClient, lines: list, **extra) -> dict:
    body = {"input_file_id": _file(client, lines), "endpoint": "/v1/chat/completions", "completion_window": "24h",
            **extra}
    response = client.post("/v1/batches", body, format="json")
    assert response.status_code == 200, response.json()
    return response.json()


def _content(file_id: str) -> list[dict]:
    file = File.objects.get(id=file_id)
    with storages["files"].open(file.storage_name, "rb") as handle:
        return [json.loads(line) for line in handle]


def test_a_batch_is_created_validating_and_its_start_is_sent(api_client, broker, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        batch = _batch(api_client, [chat_line("a")], metadata={"team": "x"}, webhook_url="https://93.184.215.14/hook")

    assert batch["object"] == "batch" and batch["id"].startswith("batch_") and batch["status"] == "validating"
    assert batch["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert batch["metadata"] == {"team": "x"} and batch["expires_at"] - batch["created_at"] == 24 * 3600
    assert Batch.objects.get(id=batch["id"]).webhook_url == "https://93.184.215.14/hook"
    assert (START_BATCH_TASK, [batch["id"]]) in [(name, args) for name, args, _ in broker.messages]


def test_a_started_batch_holds_one_job_per_line_at_batch_priority(api_client, api_key, settings, dispatched):
    batch_id = _batch(api_client, [chat_line("a"), chat_line("b", "Bye")])["id"]

    assert batch_start(batch_id=batch_id)

    jobs = Job.objects.filter(batch_id=batch_id).order_by("created_at")
    assert [j.custom_id for j in jobs] == ["a", "b"]
    assert {(j.status, j.dispatch_count, j.priority, j.api_key_id) for j in jobs} == {
        ("queued", 0, settings.BATCH_JOB_PRIORITY, api_key.id)}
    assert dispatched == []  # held: only the feeder sends them
    assert api_client.get(f"/v1/batches/{batch_id}").json()["status"] == "in_progress"
    assert not batch_start(batch_id=batch_id)  # a second start changes nothing
    assert Job.objects.filter(batch_id=batch_id).count() == 2


def test_a_batch_job_is_never_more_urgent_than_batches_its_key_or_its_line(api_client, api_key, settings):
    api_key.priority = 150
    api_key.save()
    batch_id = _batch(api_client, [chat_line("a"), chat_line("b", priority=200)])["id"]

    batch_start(batch_id=batch_id)

    assert dict(Job.objects.filter(batch_id=batch_id).values_list("custom_id", "priority")) == {"a": 150, "b": 200}


def test_a_batch_whose_lines_cannot_run_fails_naming_them(api_client, api_key):
    api_key.max_tokens_per_job = 4
    api_key.save()
    batch_id = _batch(api_client, [chat_line("a", max_tokens=2), chat_line("b", max_tokens=9)])["id"]

    batch_start(batch_id=batch_id)

    batch = api_client.get(f"/v1/batches/{batch_id}").json()
    assert batch["status"] == "failed" and batch["failed_at"]
    [error] = batch["errors"]["data"]
    assert (error["line"], error["code"], error["param"]) == (2, "max_tokens_too_large", "body.max_tokens")
    assert not Job.objects.filter(batch_id=batch_id).exists()


def test_the_feeder_sends_at_most_the_cap_of_a_keys_batch_jobs(api_client, api_key, settings, dispatched,
                                                             django_capture_on_commit_callbacks):
    settings.BATCH_JOBS_IN_FLIGHT_PER_KEY = 2
    batch_id = _batch(api_client, [chat_line(str(i)) for i in range(5)])["id"]
    batch_start(batch_id=batch_id)

    with django_capture_on_commit_callbacks(execute=True):
        first = batch_feed(api_key_id=api_key.id)
        again = batch_feed(api_key_id=api_key.id)
    assert len(first) == 2 and again == [] and dispatched == first

    finish(Job.objects.get(id=first[0]))
    with django_capture_on_commit_callbacks(execute=True):
        third = batch_feed(api_key_id=api_key.id)
    assert len(third) == 1 and dispatched == first + third
    assert Job.objects.filter(batch_id=batch_id, dispatch_count=0).count() == 2


def test_batch_jobs_skip_the_request_rate_and_the_concurrent_jobs_quota(api_client, api_key, redis_client):
    api_key.requests_per_minute = 2
    api_key.max_concurrent_jobs = 1
    api_key.save()
    batch_id = _batch(api_client, [chat_line(str(i)) for i in range(4)])["id"]
    batch_start(batch_id=batch_id)
    assert len(batch_feed(api_key_id=api_key.id)) == 4

    # Four batch jobs in flight: the key's one interactive job is still accepted.
    response = api_client.post("/api/v1/jobs", {"prompt": "hi", "max_tokens": 4}, format="json")
    assert response.status_code == 202, response.json()


def test_the_daily_token_quota_holds_batch_jobs_back(api_client, api_key):
    batch_id = _batch(api_client, [chat_line(str(i)) for i in range(3)])["id"]
    batch_start(batch_id=batch_id)
    need = [len(j.prompt_token_ids) + j.max_tokens for j in Job.objects.filter(batch_id=batch_id)]
    api_key.tokens_per_day = need[0] + need[1] + 1  # room for two of the three
    api_key.save()

    assert len(batch_feed(api_key_id=api_key.id)) == 2
    held = Job.objects.get(batch_id=batch_id, dispatch_count=0)
    # Held jobs reserve nothing: an interactive job still fits in what is left... until sent ones are counted.
    assert held.status == JobStatus.QUEUED
    response = api_client.post("/api/v1/jobs", {"prompt": "hi", "max_tokens": 4}, format="json")
    assert response.status_code == 429 and response.json()["error"]["code"] == "tokens_per_day_exceeded"


def test_a_finished_batch_writes_openais_output_and_error_files_from_its_jobs(api_client, api_key):
    batch_id = _batch(api_client, [chat_line("a"), chat_line("b"), chat_line("c")])["id"]
    batch_start(batch_id=batch_id)
    batch_feed(api_key_id=api_key.id)
    jobs = {j.custom_id: j for j in Job.objects.filter(batch_id=batch_id)}
    finish(jobs["a"], text="alpha")
    finish(jobs["b"], text="", status=JobStatus.FAILED, error="boom")
    assert batch_advance(batch_id=batch_id) is None  # c still runs
    finish(jobs["c"], text="gamma")

    ended = batch_advance(batch_id=batch_id)

    assert ended is not None and ended.status == BatchStatus.COMPLETED
    batch = api_client.get(f"/v1/batches/{batch_id}").json()
    assert batch["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    assert batch["finalizing_at"] and batch["completed_at"]
    output = _content(batch["output_file_id"])
    assert [line["custom_id"] for line in output] == ["a", "c"]
    a = output[0]
    assert a["id"] == f"batch_req_{jobs['a'].id.hex}" and a["error"] is None
    assert (a["response"]["status_code"], a["response"]["request_id"]) == (200, str(jobs["a"].id))
    body = a["response"]["body"]
    assert body["id"] == f"chatcmpl-{jobs['a'].id}" and body["object"] == "chat.completion" and body["model"] == "tiny"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "alpha"}
    assert body["usage"]["completion_tokens"] == 3
    [b] = _content(batch["error_file_id"])
    assert b["custom_id"] == "b" and b["response"]["status_code"] == 502
    assert b["response"]["body"]["error"]["code"] == "job_failed" and "boom" in b["response"]["body"]["error"]["message"]
    assert batch_advance(batch_id=batch_id) is None  # ended once: no second set of files
    assert File.objects.filter(purpose="batch_output").count() == 2


def test_cancel_ends_held_jobs_at_once_and_the_batch_once_sent_ones_end(api_client, api_key, settings):
    settings.BATCH_JOBS_IN_FLIGHT_PER_KEY = 1
    batch_id = _batch(api_client, [chat_line(str(i)) for i in range(3)])["id"]
    batch_start(batch_id=batch_id)
    [sent] = batch_feed(api_key_id=api_key.id)
    Job.objects.filter(id=sent).update(status=JobStatus.IN_PROGRESS, worker_id="w-1")

    response = api_client.post(f"/v1/batches/{batch_id}/cancel")

    assert response.status_code == 200 and response.json()["status"] == "cancelling"
    assert Job.objects.filter(batch_id=batch_id, status=JobStatus.CANCELLED).count() == 2
    assert Job.objects.get(id=sent).cancel_requested
    assert batch_advance(batch_id=batch_id) is None  # the running one has not ended yet
    finish(Job.objects.get(id=sent), text="partial", status=JobStatus.CANCELLED)
    assert batch_advance(batch_id=batch_id).status == BatchStatus.CANCELLED
    batch = api_client.get(f"/v1/batches/{batch_id}").json()
    assert batch["cancelled_at"] and batch["output_file_id"] is None
    errors = _content(batch["error_file_id"])
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"} and len(errors) == 3
    assert api_client.post(f"/v1/batches/{batch_id}/cancel").json()["status"] == "cancelled"


def test_beat_tick_starts_feeds_and_ends_batches_whose_messages_were_lost(api_client, api_key, dispatched,
                                                                        django_capture_on_commit_callbacks):
    batch_id = _batch(api_client, [chat_line("a")])["id"]  # its start message never ran

    with django_capture_on_commit_callbacks(execute=True):
        tick_batches()
    [job] = Job.objects.filter(batch_id=batch_id)
    assert dispatched == [str(job.id)]
    finish(job)
    tick_batches()
    assert Batch.objects.get(id=batch_id).status == BatchStatus.COMPLETED


def test_the_sink_asks_for_progress_once_per_batch_whose_jobs_end_without_reading_them(
        api_client, api_key, broker, redis_client):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from api.worker.sink import RedisJobSink
    from engine_worker.protocol import FinalResult, StepBatch

    batch_id = _batch(api_client, [chat_line("a"), chat_line("b")])["id"]
    batch_start(batch_id=batch_id)
    jobs = list(Job.objects.filter(batch_id=batch_id))
    interactive = Job.objects.create(owner=api_key.owner, api_key=api_key, prompt="x")
    Job.objects.filter(id__in=[j.id for j in (*jobs, interactive)]).update(status=JobStatus.IN_PROGRESS, worker_id="w")
    broker.messages.clear()
    sink = RedisJobSink(worker_id="w", redis_client=redis_client)

    with CaptureQueriesContext(connection) as queries:
        sink.publish(StepBatch(finals=tuple(
            FinalResult(job_id=str(j.id), text="t", finish_reason="stop", prompt_tokens=1, completion_tokens=1)
            for j in (*jobs, interactive))))

    assert [(name, args) for name, args, _ in broker.messages] == [(BATCH_PROGRESS_TASK, [api_key.id, batch_id])]
    # The finals' UPDATE says which batches moved: nothing reads the rows again.
    assert not [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("SELECT")]


def test_batches_are_paged_newest_first(api_client):
    ids = [_batch(api_client, [chat_line("a")])["id"] for _ in range(3)]

    first = api_client.get("/v1/batches", {"limit": 2}).json()
    assert [b["id"] for b in first["data"]] == ids[:0:-1] and first["has_more"] is True
    assert (first["first_id"], first["last_id"]) == (ids[2], ids[1])
    rest = api_client.get("/v1/batches", {"limit": 2, "after": first["last_id"]}).json()
    assert [b["id"] for b in rest["data"]] == [ids[0]] and rest["has_more"] is False
    assert api_client.get("/v1/batches", {"limit": 0}).status_code == 400


def test_another_users_batch_is_not_found(api_client, redis_client):
    batch_id = _batch(api_client, [chat_line("a")])["id"]
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {make_api_key()[1]}")

    for response in (other.get(f"/v1/batches/{batch_id}"), other.post(f"/v1/batches/{batch_id}/cancel")):
        assert response.status_code == 404 and response.json()["error"]["code"] == "batch_not_found"
    assert other.get("/v1/batches").json()["data"] == []


def test_a_batch_needs_a_batch_file_of_yours_a_known_endpoint_and_the_24h_window(api_client, redis_client):
    file_id = _file(api_client, [chat_line("a")])
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {make_api_key()[1]}")
    base = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}

    assert other.post("/v1/batches", base, format="json").status_code == 404
    for change, param in (({"endpoint": "/v1/embeddings"}, "endpoint"), ({"completion_window": "1h"}, "completion_window"),
                          ({"webhook_url": "ftp://x"}, "webhook_url"), ({"extra": 1}, "extra")):
        response = api_client.post("/v1/batches", {**base, **change}, format="json")
        assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_the_input_of_a_running_batch_cannot_be_deleted(api_client):
    batch = _batch(api_client, [chat_line("a")])

    response = api_client.delete(f"/v1/files/{batch['input_file_id']}")

    assert response.status_code == 409 and response.json()["error"]["code"] == "file_in_use"


def test_held_jobs_are_left_to_the_feeder_by_the_reconciler_and_the_queue_expiry(api_client, api_key, settings):
    import datetime as dt

    from django.utils import timezone

    from api.jobs.services import lifecycle as job_lifecycle

    batch_id = _batch(api_client, [chat_line("a"), chat_line("b")])["id"]
    batch_start(batch_id=batch_id)
    long_ago = timezone.now() - dt.timedelta(days=1)
    Job.objects.filter(batch_id=batch_id).update(queued_at=long_ago)
    settings.BATCH_JOBS_IN_FLIGHT_PER_KEY = 1
    [sent] = batch_feed(api_key_id=api_key.id)
    Job.objects.filter(id=sent).update(lease_expires_at=long_ago)  # its message was lost; the other is held

    assert job_lifecycle.jobs_needing_dispatch(queued_grace_s=1) == [sent]
    assert job_lifecycle.jobs_expire_queued(older_than_s=1) == 0


def test_a_batch_whose_key_is_revoked_is_cancelled(api_client, api_key):
    from api.keys.services import api_key_revoke

    batch_id = _batch(api_client, [chat_line("a"), chat_line("b")])["id"]
    batch_start(batch_id=batch_id)
    api_key_revoke(api_key_id=api_key.id)

    assert batch_feed(api_key_id=api_key.id) == []
    assert batch_advance(batch_id=batch_id).status == BatchStatus.CANCELLED


def test_a_batch_names_no_private_webhook_url(api_client):
    body = {"input_file_id": _file(api_client, [chat_line("a")]), "endpoint": "/v1/chat/completions",
            "completion_window": "24h", "webhook_url": "http://127.0.0.1:9/hook"}

    response = api_client.post("/v1/batches", body, format="json")

    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_webhook_url"
    assert not Batch.objects.exists()


def test_a_batch_that_ends_announces_itself_once_to_its_webhook(api_client, api_key, settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    batch_id = _batch(api_client, [chat_line("a")], webhook_url="http://127.0.0.1:9/hook")["id"]
    batch_start(batch_id=batch_id)
    batch_feed(api_key_id=api_key.id)
    finish(Job.objects.get(batch_id=batch_id), text="alpha")

    assert batch_advance(batch_id=batch_id).status == BatchStatus.COMPLETED
    assert batch_advance(batch_id=batch_id) is None

    [delivery] = WebhookDelivery.objects.all()
    assert (delivery.event_type, delivery.event_id, delivery.url) == (
        "batch.completed", f"batch_{batch_id}", "http://127.0.0.1:9/hook")
    assert delivery.api_key_id == api_key.id
    data = json.loads(delivery.payload)["data"]
    assert data["id"] == batch_id and data["status"] == "completed" and data["output_file_id"]
    assert data["request_counts"] == {"total": 1, "completed": 1, "failed": 0}


def test_a_batch_whose_lines_fail_validation_announces_its_failure(api_client, api_key, settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    api_key.max_tokens_per_job = 8
    api_key.save()
    batch_id = _batch(api_client, [chat_line("a", max_tokens=100)], webhook_url="http://127.0.0.1:9/hook")["id"]

    batch_start(batch_id=batch_id)

    assert Batch.objects.get(id=batch_id).status == BatchStatus.FAILED
    [delivery] = WebhookDelivery.objects.all()
    assert delivery.event_type == "batch.failed" and json.loads(delivery.payload)["data"]["errors"]["data"]
