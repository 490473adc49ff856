"""Races between concurrent submissions, with real transactions on Postgres."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from api.errors import QuotaExceeded
from api.models import Job
from api.services.jobs import JobRequest, job_create
from tests.api.factories import make_api_key

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="needs row locks (Postgres)")


def _submit_concurrently(n: int, submit) -> list:
    barrier = threading.Barrier(n)
    results: list = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = submit()
        except Exception as exc:  # noqa: BLE001 - collected and asserted on
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results


def test_concurrent_retries_with_one_idempotency_key_create_one_job(transactional_db, redis_client, dispatched):
    api_key, _ = make_api_key()
    request = JobRequest(prompt="Hello", max_tokens=4)

    results = _submit_concurrently(
        4, lambda: job_create(owner=api_key.owner, api_key=api_key, request=request, idempotency_key="same")
    )

    assert all(isinstance(r, tuple) for r in results), results
    assert len({str(r.job.id) for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert Job.objects.count() == 1


def test_concurrent_submissions_never_exceed_the_concurrent_jobs_quota(transactional_db, redis_client, dispatched):
    api_key, _ = make_api_key(max_concurrent_jobs=2)

    results = _submit_concurrently(
        5, lambda: job_create(owner=api_key.owner, api_key=api_key, request=JobRequest(prompt="Hi", max_tokens=4))
    )

    assert sum(isinstance(r, tuple) for r in results) == 2
    assert sum(isinstance(r, QuotaExceeded) for r in results) == 3
    assert Job.objects.count() == 2


def test_a_submission_waiting_for_the_keys_lock_counts_the_job_committed_by_its_holder(
        transactional_db, redis_client, dispatched):
    """The gate reads the usage after the lock is granted (a new snapshot), so the job that the
    lock's holder commits meanwhile is counted: here it takes the key's only slot."""
    import psycopg
    from django.utils import timezone

    from api.services.job_insert import _insert_params, _statement
    from api.services.quotas import quota_gate_params, quota_gate_sql
    from tests.api.factories import make_job

    api_key, _ = make_api_key(max_concurrent_jobs=1)
    held = make_job(api_key=api_key)
    Job.objects.filter(id=held.id).delete()  # an unsaved twin to insert by hand below
    settings = connection.settings_dict
    holder = psycopg.connect(host=settings["HOST"], port=settings["PORT"], user=settings["USER"],
                             dbname=settings["NAME"], autocommit=True)
    outcome: list = []
    try:
        with psycopg.ClientCursor(holder) as cursor:
            cursor.execute("BEGIN")
            cursor.execute(_statement("default").sql, _insert_params(held, "default"))
            cursor.execute(quota_gate_sql(), quota_gate_params(api_key_id=api_key.id, job_id=held.id,
                                                               now=timezone.now()))
            assert cursor.fetchone()[2] == 1  # the holder's job alone: within the quota

            def submit() -> None:
                try:
                    outcome.append(job_create(owner=api_key.owner, api_key=api_key,
                                              request=JobRequest(prompt="Hi", max_tokens=4)))
                except QuotaExceeded as exc:
                    outcome.append(exc)
                finally:
                    connection.close()

            waiter = threading.Thread(target=submit)
            waiter.start()
            waiter.join(0.5)
            assert waiter.is_alive() and not outcome  # queued on the key's lock
            cursor.execute("COMMIT")
            waiter.join(10)
    finally:
        holder.close()

    assert len(outcome) == 1 and isinstance(outcome[0], QuotaExceeded), outcome
    assert outcome[0].code == "concurrent_jobs_exceeded"
    assert list(Job.objects.values_list("id", flat=True)) == [held.id]
