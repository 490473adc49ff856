from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from api.common import redis_keys
from api.models import JobStatus
from tests.api.factories import make_api_key, make_job

pytestmark = pytest.mark.django_db


def test_completed_job_shows_text_finish_reason_usage_timings_and_worker(api_client, api_key):
    t0 = timezone.now()
    job = make_job(
        api_key=api_key, status=JobStatus.COMPLETED, output_text="Hello world", finish_reason="stop",
        prompt_tokens=5, cached_tokens=2, completion_tokens=11, worker_id="w-1", queued_at=t0,
        started_at=t0 + timedelta(milliseconds=10), first_token_at=t0 + timedelta(milliseconds=50),
        finished_at=t0 + timedelta(milliseconds=1050),
    )

    body = api_client.get(f"/api/v1/jobs/{job.id}").json()

    assert body["status"] == "completed" and body["output_text"] == "Hello world"
    assert body["finish_reason"] == "stop" and body["worker_id"] == "w-1" and body["error"] is None
    assert body["usage"] == {"prompt_tokens": 5, "cached_tokens": 2, "completion_tokens": 11, "total_tokens": 16}
    assert body["timings"]["ttft_ms"] == pytest.approx(50.0)
    assert body["timings"]["tokens_per_second"] == pytest.approx(10.0)
    assert body["queue_position"] is None
    for name in ("queued_at", "started_at", "first_token_at", "finished_at"):
        assert body["timings"][name] is not None


def test_running_job_shows_the_text_so_far_from_its_redis_stream_in_seq_order(api_client, api_key, redis_client):
    job = make_job(api_key=api_key, status=JobStatus.IN_PROGRESS, output_text="")
    stream = redis_keys.job_stream_key(str(job.id))
    for seq, text in [(1, "Once"), (3, " a"), (2, " upon"), (3, " a")]:  # out of order, one duplicate
        redis_client.xadd(stream, {"type": "delta", redis_keys.JOB_STREAM_FIELD_SEQ: seq, redis_keys.JOB_STREAM_FIELD_TEXT: text})
    redis_client.xadd(stream, {"type": "final", redis_keys.JOB_STREAM_FIELD_SEQ: 3, redis_keys.JOB_STREAM_FIELD_TEXT: "",
                               "data": "{}"})

    body = api_client.get(f"/api/v1/jobs/{job.id}").json()

    assert body["status"] == "in_progress" and body["output_text"] == "Once upon a"


def test_failed_job_shows_its_error(api_client, api_key):
    job = make_job(api_key=api_key, status=JobStatus.FAILED, error="engine crashed", finish_reason="error")

    body = api_client.get(f"/api/v1/jobs/{job.id}").json()

    assert body["status"] == "failed" and body["error"] == "engine crashed"


def test_another_users_job_is_404(api_client):
    other_key, _ = make_api_key()
    job = make_job(api_key=other_key)

    response = api_client.get(f"/api/v1/jobs/{job.id}")

    assert response.status_code == 404 and response.json()["error"]["code"] == "job_not_found"


def test_unknown_job_id_is_404(api_client):
    assert api_client.get("/api/v1/jobs/7b0c3bde-5f8a-4a4a-9a39-3a3e0f0a0a0a").status_code == 404
    assert api_client.get("/api/v1/jobs/not-a-uuid").status_code == 404


def test_list_shows_only_the_callers_jobs_newest_first(api_client, api_key):
    mine = [make_job(api_key=api_key, created_at=timezone.now() - timedelta(seconds=i)) for i in range(3)]
    make_job(api_key=make_api_key()[0])

    body = api_client.get("/api/v1/jobs").json()

    assert body["count"] == 3
    assert [row["id"] for row in body["results"]] == [str(job.id) for job in mine]


def test_list_filters_by_status(api_client, api_key):
    make_job(api_key=api_key, status=JobStatus.COMPLETED)
    queued = make_job(api_key=api_key)

    body = api_client.get("/api/v1/jobs?status=queued").json()

    assert [row["id"] for row in body["results"]] == [str(queued.id)]


def test_list_with_an_unknown_status_is_400(api_client):
    response = api_client.get("/api/v1/jobs?status=sleeping")
    assert response.status_code == 400 and response.json()["error"]["param"] == "status"


def test_list_is_paginated(api_client, api_key):
    for _ in range(5):
        make_job(api_key=api_key)

    first = api_client.get("/api/v1/jobs?page_size=2").json()
    last = api_client.get("/api/v1/jobs?page_size=2&page=3").json()

    assert first["count"] == 5 and len(first["results"]) == 2 and first["next"]
    assert len(last["results"]) == 1 and last["next"] is None
    assert api_client.get("/api/v1/jobs?page=99").status_code == 404


@pytest.mark.parametrize("query, param", [
    ("page=abc", "page"), ("page=0", "page"), ("page_size=0", "page_size"), ("page_size=x", "page_size"),
    ("page_size=101", "page_size"),
])
def test_list_with_a_bad_page_or_page_size_is_400(api_client, query, param):
    response = api_client.get(f"/api/v1/jobs?{query}")

    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


def test_list_page_size_up_to_the_maximum_is_accepted(api_client, api_key):
    make_job(api_key=api_key)

    response = api_client.get("/api/v1/jobs?page_size=100&page=1")

    assert response.status_code == 200 and response.json()["count"] == 1
