"""On PostgreSQL a submission is one call: BEGIN, the INSERT, the key's quota gate, COMMIT.

These tests run outside a test transaction (``transactional_db``), as requests do, because the
call sends its own BEGIN and COMMIT."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection
from django.test.utils import CaptureQueriesContext
from psycopg.pq import TransactionStatus

from api.errors import AuthenticationFailed, QuotaExceeded
from api.models import ApiKey, Job, JobStatus
from api.services.job_insert import can_insert_within_quota, job_insert_within_quota
from api.services.jobs import JobRequest, job_create
from tests.api.factories import make_api_key, make_job

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-call path is PostgreSQL's")


def _submit(api_key: ApiKey, **request):
    return job_create(owner=api_key.owner, api_key=api_key, request=JobRequest(**{"prompt": "Hi", "max_tokens": 4,
                                                                                 **request}))


def _idle() -> bool:
    """The connection is outside any transaction (nothing left open or aborted)."""
    return connection.connection.info.transaction_status == TransactionStatus.IDLE


def test_a_submission_is_one_call_that_commits(transactional_db, redis_client, dispatched):
    api_key, _ = make_api_key()
    make_job(api_key=api_key)  # one job ahead in the queue
    assert can_insert_within_quota()

    with CaptureQueriesContext(connection) as queries:
        submission = _submit(api_key)

    [call] = queries.captured_queries
    assert call["sql"].startswith("BEGIN;") and call["sql"].rstrip().endswith("COMMIT")
    # The key's gate is the server function (its plans are the connection's), not SQL text.
    assert "api_key_gate(" in call["sql"] and "FOR NO KEY UPDATE" not in call["sql"]
    assert submission.created and submission.queue_position == 1
    assert Job.objects.get(id=submission.job.id).status == JobStatus.QUEUED
    assert dispatched == [str(submission.job.id)]
    assert _idle()


def test_the_gate_refuses_a_job_over_the_concurrency_quota_and_keeps_no_row(transactional_db, redis_client,
                                                                           dispatched):
    api_key, _ = make_api_key(max_concurrent_jobs=1)
    make_job(api_key=api_key, status=JobStatus.IN_PROGRESS)

    with pytest.raises(QuotaExceeded) as refused:
        _submit(api_key)

    assert refused.value.code == "concurrent_jobs_exceeded"
    assert Job.objects.count() == 1 and dispatched == []
    assert _idle()


def test_the_gate_counts_todays_tokens_with_the_new_job_reserved(transactional_db, redis_client, dispatched):
    api_key, _ = make_api_key(tokens_per_day=60)
    make_job(api_key=api_key, status=JobStatus.COMPLETED, prompt_tokens=20, completion_tokens=25)

    with pytest.raises(QuotaExceeded) as refused:
        _submit(api_key, max_tokens=20)

    assert refused.value.code == "tokens_per_day_exceeded"
    assert "45 of 60 tokens used today" in str(refused.value)
    assert Job.objects.count() == 1 and dispatched == []

    _submit(api_key, max_tokens=4)  # 45 + a few prompt tokens + 4: within the quota

    assert Job.objects.count() == 2 and len(dispatched) == 1


def test_a_key_deleted_after_authentication_inserts_nothing(transactional_db, redis_client, dispatched):
    api_key, _ = make_api_key()
    ApiKey.objects.filter(id=api_key.id).delete()

    with pytest.raises(AuthenticationFailed) as refused:  # a 401, as for any unknown key
        _submit(api_key)

    assert refused.value.status_code == 401

    assert Job.objects.count() == 0 and dispatched == []
    assert _idle()


def test_a_failed_call_is_rolled_back_and_the_connection_stays_usable(transactional_db, redis_client):
    api_key, _ = make_api_key()
    first = make_job(api_key=api_key, idempotency_key="same")
    duplicate = Job(owner=api_key.owner, api_key=api_key, prompt="Hi", prompt_token_ids=[1], params={"max_tokens": 4},
                    idempotency_key="same", request_fingerprint="f" * 64)

    with pytest.raises(IntegrityError):
        job_insert_within_quota(duplicate, now=first.created_at)

    assert _idle()
    assert list(Job.objects.values_list("id", flat=True)) == [first.id]


def test_the_gate_function_reads_the_usage_the_python_query_reads(transactional_db):
    """Migration 0004's function repeats quotas._KEY_USAGE_SQL's usage query: both must agree, on
    active jobs, the day's reservations and the finished jobs' engine counts."""
    from django.utils import timezone

    from api.services.quotas import _lock_key_and_usage, quota_gate_params, quota_gate_sql

    api_key, _ = make_api_key(max_concurrent_jobs=50, tokens_per_day=10_000)
    make_job(api_key=api_key, prompt_token_ids=[1, 2, 3], params={"max_tokens": 7})
    make_job(api_key=api_key, status=JobStatus.IN_PROGRESS, prompt_token_ids=[1] * 11, params={"max_tokens": 5})
    make_job(api_key=api_key, status=JobStatus.COMPLETED, prompt_tokens=20, completion_tokens=25)
    make_job(api_key=make_api_key()[0])  # another key's job counts for nothing here
    now = timezone.now()
    missing = "00000000-0000-0000-0000-000000000000"  # the gate deletes nothing it may not

    with connection.cursor() as cursor:
        cursor.execute(quota_gate_sql(), quota_gate_params(api_key_id=api_key.id, job_id=missing, now=now))
        from_function = cursor.fetchone()
    from_python = _lock_key_and_usage(api_key=api_key, now=now)

    assert tuple(from_function) == (50, 10_000, 2, 3 + 7 + 11 + 5 + 45)
    assert tuple(from_function) == (from_python.max_concurrent_jobs, from_python.tokens_per_day,
                                    from_python.active_jobs, from_python.tokens_used)
    assert _idle()


def test_the_gate_function_refuses_exactly_when_the_usage_exceeds_a_limit(transactional_db):
    from django.utils import timezone

    from api.services.quotas import KeyUsage, quota_gate_params, quota_gate_sql

    api_key, _ = make_api_key(max_concurrent_jobs=1)
    kept, over = make_job(api_key=api_key), make_job(api_key=api_key)

    with connection.cursor() as cursor:
        cursor.execute(quota_gate_sql(), quota_gate_params(api_key_id=api_key.id, job_id=over.id, now=timezone.now()))
        usage = KeyUsage(*cursor.fetchone())
        cursor.execute(quota_gate_sql(), quota_gate_params(api_key_id=-1, job_id=kept.id, now=timezone.now()))
        gone = cursor.fetchall()

    assert usage.exceeded() and usage.active_jobs == 2
    assert list(Job.objects.values_list("id", flat=True)) == [kept.id]  # the job it was asked about, deleted
    assert gone == []  # no such key: no row, nothing deleted
