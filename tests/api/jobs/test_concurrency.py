"""Races between concurrent submissions, with real transactions on Postgres."""

from __future__ import annotations

import threading
from unittest import mock

import pytest
from django.db import connection

from api.common.errors import QuotaExceeded
from api.jobs.services.submission import JobRequest, job_create
from api.keys import quotas
from api.models import Job
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
    api_key, _ = make_api_key(max_concurrent_jobs=1)
    holding, release = threading.Event(), threading.Event()

    def gate_then_hold(**kwargs) -> None:
        quotas.quota_gate(**kwargs)
        if threading.current_thread().name == "holder":  # the key's lock is held until its commit
            holding.set()
            release.wait(10)

    outcome: dict[str, object] = {}

    def submit() -> None:
        try:
            outcome[threading.current_thread().name] = job_create(
                owner=api_key.owner, api_key=api_key, request=JobRequest(prompt="Hi", max_tokens=4))
        except QuotaExceeded as exc:
            outcome[threading.current_thread().name] = exc
        finally:
            connection.close()

    with mock.patch("api.jobs.services.submission.quota_gate", side_effect=gate_then_hold):
        holder = threading.Thread(target=submit, name="holder")
        holder.start()
        assert holding.wait(10)
        waiter = threading.Thread(target=submit, name="waiter")
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive() and "waiter" not in outcome  # queued on the key's lock
        release.set()
        holder.join(10)
        waiter.join(10)

    assert isinstance(outcome["waiter"], QuotaExceeded), outcome
    assert outcome["waiter"].code == "concurrent_jobs_exceeded"
    assert list(Job.objects.values_list("id", flat=True)) == [outcome["holder"].job.id]
