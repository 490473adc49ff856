from __future__ import annotations

import datetime as dt
import uuid
from unittest import mock

import pytest
import redis
from django.db import connection
from django.utils import timezone

from api.common.errors import AuthenticationFailed, QuotaExceeded
from api.jobs.services.submission import JobRequest, job_create
from api.keys import quotas
from api.keys.quotas import QUOTA_HOLD_S, quota_key_usage, usage_rollup
from api.models import ApiKey, Job, JobStatus, QuotaHold, UsageRecord
from api.serving.tokenization import get_tokenizer
from tests.api.factories import make_api_key, make_job

pytestmark = pytest.mark.django_db

BODY = {"prompt": "hello", "max_tokens": 4}


def assert_429(response, code: str) -> None:
    assert response.status_code == 429, response.content
    error = response.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == code
    assert int(response["Retry-After"]) >= 1
    for header in ("x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"):
        assert header in response


def test_requests_per_minute_over_the_limit_is_429_with_retry_after(api_client, api_key):
    api_key.requests_per_minute = 2
    api_key.save()

    statuses = [api_client.post("/api/v1/jobs", BODY, format="json").status_code for _ in range(2)]
    third = api_client.post("/api/v1/jobs", BODY, format="json")

    assert statuses == [202, 202]
    assert_429(third, "requests_per_minute_exceeded")
    assert third["x-ratelimit-limit"] == "2" and third["x-ratelimit-remaining"] == "0"
    assert int(third["Retry-After"]) <= 60


def test_accepted_requests_report_the_remaining_request_rate(api_client, api_key):
    api_key.requests_per_minute = 5
    api_key.save()

    response = api_client.post("/api/v1/jobs", BODY, format="json")

    assert response.status_code == 202
    assert (response["x-ratelimit-limit"], response["x-ratelimit-remaining"]) == ("5", "4")
    assert 0 <= int(response["x-ratelimit-reset"].rstrip("s")) <= 60


def test_request_rate_is_counted_per_key(api_client, api_key):
    api_key.requests_per_minute = 1
    api_key.save()
    api_client.post("/api/v1/jobs", BODY, format="json")
    _, other_secret = make_api_key(owner=api_key.owner, requests_per_minute=1)
    api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {other_secret}")

    assert api_client.post("/api/v1/jobs", BODY, format="json").status_code == 202


def test_rate_limit_lets_requests_through_when_redis_is_down(api_client, api_key):
    api_key.requests_per_minute = 0
    api_key.save()

    with mock.patch("api.keys.quotas.get_redis", side_effect=redis.ConnectionError("down")):
        response = api_client.post("/api/v1/jobs", BODY, format="json")

    assert response.status_code == 202


def test_concurrent_jobs_over_the_limit_is_429(api_client, api_key):
    api_key.max_concurrent_jobs = 2
    api_key.save()
    make_job(api_key=api_key)
    make_job(api_key=api_key, status=JobStatus.IN_PROGRESS)
    make_job(api_key=api_key, status=JobStatus.COMPLETED)

    assert_429(api_client.post("/api/v1/jobs", BODY, format="json"), "concurrent_jobs_exceeded")


def test_tokens_per_day_counts_engine_usage_of_finished_jobs_and_reserves_for_active_ones(api_key):
    make_job(api_key=api_key, status=JobStatus.COMPLETED, prompt_tokens=10, completion_tokens=20)
    make_job(api_key=api_key, prompt_token_ids=[1, 2, 3], params={"max_tokens": 7})
    make_job(api_key=api_key, status=JobStatus.COMPLETED, prompt_tokens=100, completion_tokens=100,
             created_at=timezone.now() - dt.timedelta(days=2))

    assert quota_key_usage(api_key=api_key, now=timezone.now()).tokens_used == 30 + 10


def test_tokens_per_day_over_the_quota_is_429_until_midnight(api_client, api_key):
    api_key.tokens_per_day = 50
    api_key.save()
    make_job(api_key=api_key, status=JobStatus.COMPLETED, prompt_tokens=20, completion_tokens=25)

    response = api_client.post("/api/v1/jobs", BODY, format="json")

    assert_429(response, "tokens_per_day_exceeded")
    assert int(response["Retry-After"]) <= 86400
    assert response["x-ratelimit-remaining"] == "5"


def test_usage_rollup_sums_engine_counts_per_key_and_day_idempotently(api_key):
    other_key, _ = make_api_key(owner=api_key.owner)
    make_job(api_key=api_key, status=JobStatus.COMPLETED, prompt_tokens=10, cached_tokens=4, completion_tokens=20)
    make_job(api_key=api_key, status=JobStatus.FAILED, prompt_tokens=5, completion_tokens=1)
    make_job(api_key=api_key)  # still queued: counted as a request, no tokens yet
    make_job(api_key=other_key, status=JobStatus.COMPLETED, prompt_tokens=1, completion_tokens=2)
    today = timezone.now().date()

    assert usage_rollup(day=today) == 2
    assert usage_rollup(day=today) == 2

    record = UsageRecord.objects.get(api_key=api_key, day=today)
    assert (record.requests, record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (3, 15, 4, 21)
    assert UsageRecord.objects.count() == 2


def test_the_beat_usage_task_fills_todays_usage_records(api_key):
    from api.keys.tasks import rollup_usage

    make_job(api_key=api_key, status=JobStatus.COMPLETED, prompt_tokens=7, completion_tokens=9)
    assert rollup_usage() >= 1
    record = UsageRecord.objects.get(api_key=api_key, day=timezone.now().date())
    assert (record.requests, record.prompt_tokens, record.completion_tokens) == (1, 7, 9)


def _submit(api_key, **request):
    return job_create(owner=api_key.owner, api_key=api_key,
                      request=JobRequest(**{"prompt": "Hi", "max_tokens": 4, **request}))


def test_a_job_over_the_concurrency_quota_is_refused_and_leaves_no_row(redis_client, dispatched,
                                                                      django_capture_on_commit_callbacks):
    api_key, _ = make_api_key(max_concurrent_jobs=1)
    make_job(api_key=api_key, status=JobStatus.IN_PROGRESS)

    with django_capture_on_commit_callbacks(execute=True), pytest.raises(QuotaExceeded) as refused:
        _submit(api_key)

    assert refused.value.code == "concurrent_jobs_exceeded"
    assert Job.objects.count() == 1 and dispatched == []


def test_the_daily_quota_counts_the_new_job_reserved_and_admits_it_up_to_the_limit_exactly(
        redis_client, dispatched, django_capture_on_commit_callbacks):
    api_key, _ = make_api_key(tokens_per_day=60)
    make_job(api_key=api_key, status=JobStatus.COMPLETED, prompt_tokens=20, completion_tokens=25)
    prompt_tokens = len(get_tokenizer().encode_prompt("Hi"))

    with pytest.raises(QuotaExceeded) as refused:
        _submit(api_key, max_tokens=60 - 45 - prompt_tokens + 1)

    assert refused.value.code == "tokens_per_day_exceeded"
    assert "45 of 60 tokens used today" in str(refused.value) and refused.value.remaining == 15
    assert Job.objects.count() == 1
    with django_capture_on_commit_callbacks(execute=True):
        _submit(api_key, max_tokens=60 - 45 - prompt_tokens)  # exactly the limit: admitted
    assert Job.objects.count() == 2 and len(dispatched) == 1


def test_a_key_deleted_after_authentication_is_a_401_and_inserts_nothing(redis_client, dispatched):
    api_key, _ = make_api_key()
    ApiKey.objects.filter(id=api_key.id).delete()

    with pytest.raises(AuthenticationFailed) as refused:
        _submit(api_key)

    assert refused.value.status_code == 401
    assert Job.objects.count() == 0 and dispatched == []


def test_the_usage_report_counts_as_the_gate_does(api_key):
    make_job(api_key=api_key, prompt_token_ids=[1, 2, 3], params={"max_tokens": 7})
    make_job(api_key=api_key, status=JobStatus.IN_PROGRESS, prompt_token_ids=[1] * 11, params={"max_tokens": 5})
    make_job(api_key=api_key, status=JobStatus.COMPLETED, prompt_tokens=20, completion_tokens=25)
    make_job(api_key=api_key, status=JobStatus.CANCELLED, prompt_tokens=2, completion_tokens=1,
             deleted_at=timezone.now())  # a deleted job still counts
    make_job(api_key=make_api_key()[0], status=JobStatus.COMPLETED, prompt_tokens=9)  # another key's

    usage = quota_key_usage(api_key=api_key, now=timezone.now())

    assert (usage.active_jobs, usage.tokens_used) == (2, 3 + 7 + 11 + 5 + 45 + 3)


def test_the_gate_sums_a_keys_jobs_finished_today_from_an_index_without_reading_their_rows(api_key):
    """A key's finished jobs of the day grow with its traffic, and the gate counts them on every
    submission while it holds the key's lock (on SQLite, the database's): it reads their tokens
    from an index, not from the rows, whose prompts fill pages."""
    make_job(api_key=api_key, status=JobStatus.COMPLETED, prompt_tokens=10, completion_tokens=20)
    sql, params = quotas.usage_statement(api_key_id=api_key.id, now=timezone.now())
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # Index-only reads, or a path the planner counts as disabled: a test's table is small
            # and its statistics vary with the tests before it; a key's day is not small.
            for scan in ("seqscan", "bitmapscan", "indexscan"):
                cursor.execute(f"SET LOCAL enable_{scan} = off")
            cursor.execute("EXPLAIN " + sql, params)
            plan, wanted = "\n".join(row[0] for row in cursor.fetchall()), "Index Only Scan using job_key_day_tokens"
        else:
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
            plan, wanted = "\n".join(row[-1] for row in cursor.fetchall()), "COVERING INDEX job_key_day_tokens"

    assert wanted in plan, plan
    assert quota_key_usage(api_key=api_key, now=timezone.now()).tokens_used == 30


def test_a_key_with_finished_jobs_can_still_be_deleted_and_its_jobs_stay(api_key):
    job = make_job(api_key=api_key, status=JobStatus.COMPLETED, prompt_tokens=3, completion_tokens=4)

    api_key.delete()

    job.refresh_from_db()
    assert job.api_key_id is None


def test_a_hold_counts_as_its_job_until_it_expires(redis_client, dispatched):
    """A hold is a job admitted whose row has not committed: it takes the key's place, and one left
    by a submission that died is given back after QUOTA_HOLD_S."""
    api_key, _ = make_api_key(max_concurrent_jobs=1)
    hold = QuotaHold.objects.create(job_id=uuid.uuid4(), api_key=api_key, tokens=5, created_at=timezone.now())

    with pytest.raises(QuotaExceeded) as refused:
        _submit(api_key)
    assert refused.value.code == "concurrent_jobs_exceeded"
    assert quota_key_usage(api_key=api_key, now=timezone.now()).active_jobs == 1

    QuotaHold.objects.filter(pk=hold.pk).update(created_at=timezone.now() - dt.timedelta(seconds=QUOTA_HOLD_S + 1))
    assert _submit(api_key).created
    assert list(QuotaHold.objects.all()) == []
