"""Races between concurrent submissions, with real transactions on Postgres."""

from __future__ import annotations

import threading
from unittest import mock

import pytest
from django.db import connection, connections
from django.utils import timezone

from api.common.errors import QuotaExceeded
from api.jobs.services.submission import JobRequest, job_create
from api.keys.quotas import quota_key_usage
from api.models import Job, QuotaHold
from api.serving.tokenization import get_tokenizer
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


def test_many_concurrent_submissions_of_one_key_admit_exactly_its_job_quota(transactional_db, redis_client,
                                                                          dispatched):
    api_key, _ = make_api_key(max_concurrent_jobs=7)

    results = _submit_concurrently(24, lambda: _submit(api_key))

    assert sum(isinstance(r, tuple) for r in results) == 7, results
    assert sum(isinstance(r, QuotaExceeded) and r.code == "concurrent_jobs_exceeded" for r in results) == 17
    assert Job.objects.count() == 7 and len(dispatched) == 7
    assert QuotaHold.objects.count() == 0  # every hold became its job or was given back


def test_many_concurrent_submissions_of_one_key_admit_exactly_its_daily_tokens(transactional_db, redis_client,
                                                                             dispatched):
    needed = len(get_tokenizer().encode_prompt("Hi")) + 4
    api_key, _ = make_api_key(max_concurrent_jobs=100, tokens_per_day=5 * needed + needed - 1)

    results = _submit_concurrently(24, lambda: _submit(api_key))

    assert sum(isinstance(r, tuple) for r in results) == 5, results
    assert sum(isinstance(r, QuotaExceeded) and r.code == "tokens_per_day_exceeded" for r in results) == 19
    assert quota_key_usage(api_key=api_key, now=timezone.now()).tokens_used == 5 * needed
    assert QuotaHold.objects.count() == 0


def test_a_submission_completes_while_another_of_its_key_holds_its_transaction_open(
        transactional_db, redis_client, dispatched):
    """The key's lock is held only while the gate counts: a submission stalled before its COMMIT
    holds its place (a third one is refused) but no one waits for it."""
    api_key, _ = make_api_key(max_concurrent_jobs=2)
    committing, release = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def record(name: str, submit) -> None:
        try:
            outcome[name] = submit()
        except QuotaExceeded as exc:
            outcome[name] = exc
        finally:
            connection.close()

    def stalled_submit():
        wrapper = connections["default"]  # this thread's connection
        commit = wrapper.commit

        def stall_then_commit() -> None:
            committing.set()
            release.wait(10)
            commit()

        with mock.patch.object(wrapper, "commit", side_effect=stall_then_commit):
            return _submit(api_key)

    slow = threading.Thread(target=record, args=("slow", stalled_submit))
    slow.start()
    try:
        assert committing.wait(10)
        for name in ("second", "third"):
            thread = threading.Thread(target=record, args=(name, lambda: _submit(api_key)))
            thread.start()
            thread.join(3)
            assert not thread.is_alive(), f"the {name} submission waited for the open transaction"
        assert "slow" not in outcome  # its transaction is still open
    finally:
        release.set()
        slow.join(10)

    assert isinstance(outcome["slow"], tuple) and isinstance(outcome["second"], tuple), outcome
    assert isinstance(outcome["third"], QuotaExceeded) and outcome["third"].code == "concurrent_jobs_exceeded"
    assert Job.objects.count() == 2 and QuotaHold.objects.count() == 0


def _submit(api_key):
    return job_create(owner=api_key.owner, api_key=api_key, request=JobRequest(prompt="Hi", max_tokens=4))
