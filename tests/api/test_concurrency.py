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
