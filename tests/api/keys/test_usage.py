"""GET /api/v1/usage: the calling key's quotas, where it stands, and its daily usage."""

from __future__ import annotations

import datetime as dt
from unittest import mock

import pytest
import redis
from django.utils import timezone
from rest_framework.test import APIClient

from api.models import JobStatus, UsageRecord
from tests.api.factories import make_api_key, make_job

pytestmark = pytest.mark.django_db


def test_usage_counts_each_quota_as_the_submission_does(api_client, api_key):
    api_key.requests_per_minute, api_key.max_concurrent_jobs, api_key.tokens_per_day = 5, 3, 1000
    api_key.save()
    for _ in range(2):
        assert api_client.post("/api/v1/jobs", {"prompt": "hello", "max_tokens": 4}, format="json").status_code == 202
    make_job(api_key=api_key, status=JobStatus.COMPLETED, prompt_tokens=10, completion_tokens=20)
    make_job(api_key=api_key, status=JobStatus.COMPLETED, prompt_tokens=100, completion_tokens=100,
             created_at=timezone.now() - dt.timedelta(days=2))  # an earlier day: not today's tokens

    response = api_client.get("/api/v1/usage")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["object"] == "usage"
    assert body["key"]["prefix"] == api_key.prefix and body["key"]["name"] == api_key.name
    assert "hashed_key" not in body["key"]
    rate = body["requests_per_minute"]
    assert (rate["limit"], rate["used"], rate["remaining"]) == (5, 2, 3)  # the GET itself not counted
    assert 0 < rate["reset_s"] <= 60
    assert body["concurrent_jobs"] == {"limit": 3, "active": 2, "remaining": 1}
    prompt_tokens = len(api_key.jobs.filter(status=JobStatus.QUEUED).first().prompt_token_ids)
    tokens = body["tokens_per_day"]
    used = 30 + 2 * (prompt_tokens + 4)  # the finished job's engine counts + each queued job's reservation
    assert (tokens["limit"], tokens["used"], tokens["remaining"]) == (1000, used, 1000 - used)
    assert 0 < tokens["reset_s"] <= 86400
    assert body["max_tokens_per_job"] == api_key.max_tokens_per_job and body["priority"] == api_key.priority


def test_reading_usage_does_not_count_against_the_request_rate(api_client, api_key):
    api_key.requests_per_minute = 1
    api_key.save()
    for _ in range(3):
        assert api_client.get("/api/v1/usage").status_code == 200

    assert api_client.post("/api/v1/jobs", {"prompt": "hello", "max_tokens": 4}, format="json").status_code == 202
    assert api_client.get("/api/v1/usage").json()["requests_per_minute"]["remaining"] == 0


def test_remaining_is_never_negative_once_a_quota_is_lowered_below_its_use(api_client, api_key):
    make_job(api_key=api_key)
    make_job(api_key=api_key, status=JobStatus.IN_PROGRESS)
    api_key.max_concurrent_jobs, api_key.tokens_per_day = 1, 5
    api_key.save()

    body = api_client.get("/api/v1/usage").json()

    assert body["concurrent_jobs"] == {"limit": 1, "active": 2, "remaining": 0}
    assert body["tokens_per_day"]["used"] > 5 and body["tokens_per_day"]["remaining"] == 0


def test_usage_lists_the_keys_rolled_up_days_newest_first_within_the_window(api_client, api_key):
    today = timezone.now().astimezone(dt.UTC).date()
    other_key, _ = make_api_key(owner=api_key.owner)
    for days_ago, requests in ((1, 4), (2, 7), (3, 9)):
        UsageRecord.objects.create(api_key=api_key, owner=api_key.owner, day=today - dt.timedelta(days=days_ago),
                                   requests=requests, prompt_tokens=10 * requests, cached_tokens=requests,
                                   completion_tokens=100)
    UsageRecord.objects.create(api_key=other_key, owner=api_key.owner, day=today - dt.timedelta(days=1), requests=99)

    days = api_client.get("/api/v1/usage?days=3").json()["days"]

    assert [(d["day"], d["requests"]) for d in days] == [(str(today - dt.timedelta(days=1)), 4),
                                                         (str(today - dt.timedelta(days=2)), 7)]
    assert days[0]["prompt_tokens"] == 40 and days[0]["cached_tokens"] == 4 and days[0]["completion_tokens"] == 100
    assert days[0]["total_tokens"] == 140 and days[0]["updated_at"]
    assert len(api_client.get("/api/v1/usage?days=4").json()["days"]) == 3


def test_todays_usage_is_listed_at_once_from_the_jobs_before_any_roll_up(api_client, api_key):
    today = timezone.now().astimezone(dt.UTC).date()
    make_job(api_key=api_key, status=JobStatus.COMPLETED, prompt_tokens=3, cached_tokens=1, completion_tokens=16)
    make_job(api_key=api_key, status=JobStatus.IN_PROGRESS, prompt_tokens=3, completion_tokens=5)
    make_job(api_key=make_api_key(owner=api_key.owner)[0], status=JobStatus.COMPLETED, completion_tokens=50)
    # A stale row of today (the roll-up ran before the jobs above) is not what is shown.
    UsageRecord.objects.create(api_key=api_key, owner=api_key.owner, day=today, requests=1)

    days = api_client.get("/api/v1/usage?days=1").json()["days"]

    # Both jobs are requests; only the finished one's tokens count, as the quota charges them.
    assert len(days) == 1
    assert (days[0]["day"], days[0]["requests"], days[0]["prompt_tokens"], days[0]["cached_tokens"],
            days[0]["completion_tokens"], days[0]["total_tokens"]) == (str(today), 2, 3, 1, 16, 19)


def test_a_key_without_jobs_today_lists_no_row_for_today(api_client, api_key):
    assert api_client.get("/api/v1/usage").json()["days"] == []


@pytest.mark.parametrize("query", ["days=0", "days=91", "days=abc"])
def test_a_bad_days_parameter_is_400(api_client, query):
    response = api_client.get(f"/api/v1/usage?{query}")

    assert response.status_code == 400
    assert response.json()["error"]["param"] == "days"


def test_usage_without_a_valid_key_is_401(db, redis_client):
    assert APIClient().get("/api/v1/usage").status_code == 401
    key, secret = make_api_key()
    key.revoked_at = timezone.now()
    key.save()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert client.get("/api/v1/usage").status_code == 401


def test_with_redis_down_the_request_rate_is_unknown_and_the_rest_still_answers(api_client, api_key):
    make_job(api_key=api_key)
    with mock.patch("api.keys.quotas.get_redis", side_effect=redis.ConnectionError("down")):
        response = api_client.get("/api/v1/usage")

    assert response.status_code == 200
    body = response.json()
    assert body["requests_per_minute"] == {"limit": api_key.requests_per_minute, "used": None, "remaining": None,
                                           "reset_s": None}
    assert body["concurrent_jobs"]["active"] == 1


def test_the_usage_endpoint_is_in_the_schema(db):
    schema = APIClient().get("/api/v1/schema").json()

    operation = schema["paths"]["/api/v1/usage"]["get"]
    assert {p["name"] for p in operation["parameters"]} == {"days"}
    assert "tokens_per_day" in schema["components"]["schemas"]["KeyUsage"]["properties"]
