"""KeyDayTokens (PostgreSQL): the trigger keeps each key's finished-job tokens per creation day
equal to the sum over its jobs, through every change a job goes through, so the quota gate can read
one row instead of summing the day's jobs."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.db.models import F, Sum
from django.utils import timezone

from api.models import ACTIVE_STATUSES, ApiKey, Job, JobStatus, KeyDayTokens
from api.services import job_lifecycle
from api.services.jobs import job_cancel, job_requeue
from api.services.quotas import api_key_tokens_used_today
from engine_worker.protocol import FinalResult
from tests.api.factories import make_api_key, make_job

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the trigger is PostgreSQL's"),
]


def _summed(api_key: ApiKey) -> dict[dt.date, int]:
    """What the counter must hold: the key's finished jobs' tokens, by UTC creation day."""
    rows = (Job.objects.filter(api_key=api_key).exclude(status__in=ACTIVE_STATUSES)
            .values_list("created_at", "prompt_tokens", "completion_tokens"))
    out: dict[dt.date, int] = {}
    for created, prompt, completion in rows:
        day = created.astimezone(dt.UTC).date()
        out[day] = out.get(day, 0) + prompt + completion
    return {day: tokens for day, tokens in out.items() if tokens}


def _counted(api_key: ApiKey) -> dict[dt.date, int]:
    return {row.day: row.tokens for row in KeyDayTokens.objects.filter(api_key=api_key) if row.tokens}


def _final(job: Job, reason: str, prompt: int, completion: int) -> FinalResult:
    return FinalResult(job_id=str(job.id), text="x", finish_reason=reason, prompt_tokens=prompt,
                       completion_tokens=completion)


def test_the_counter_follows_every_transition_of_a_job(redis_client):
    api_key, _ = make_api_key()
    check = lambda: _counted(api_key) == _summed(api_key)  # noqa: E731

    done = make_job(api_key=api_key, status=JobStatus.IN_PROGRESS, worker_id="w")
    assert job_lifecycle.job_complete(result=_final(done, "length", 7, 16), worker_id="w")
    assert check() and _counted(api_key) == {timezone.now().astimezone(dt.UTC).date(): 23}

    # A running job the user cancelled: its partial usage arrives with the worker's abort.
    aborted = make_job(api_key=api_key, status=JobStatus.IN_PROGRESS, worker_id="w")
    job_cancel(job_id=aborted.id)
    assert job_lifecycle.job_complete(result=_final(aborted, "abort", 5, 3), worker_id="w")
    assert check()

    # A job that fails after its progress was recorded is charged what it generated.
    failed = make_job(api_key=api_key, status=JobStatus.IN_PROGRESS, worker_id="w", prompt_tokens=4)
    job_lifecycle.jobs_record_progress(worker_id="w", progress=[
        job_lifecycle.Progress(job_id=str(failed.id), text="abc", last_seq=3, completion_tokens=3)])
    assert job_lifecycle.job_fail(job_id=str(failed.id), worker_id="w", error="boom")
    assert check()

    # An operator's requeue starts a failed job afresh: its tokens leave the day's count.
    job_requeue(job_id=failed.id)
    assert check()

    # Cancelled or expired before running: nothing to charge.
    job_cancel(job_id=make_job(api_key=api_key).id)
    make_job(api_key=api_key, queued_at=timezone.now() - dt.timedelta(hours=2))
    job_lifecycle.jobs_expire_queued(older_than_s=3600)
    assert check()

    # Finished jobs of an earlier day count on that day; a deleted job no longer counts.
    make_job(api_key=api_key, status=JobStatus.COMPLETED, prompt_tokens=100, completion_tokens=1,
             created_at=timezone.now() - dt.timedelta(days=2))
    Job.objects.filter(id=aborted.id).delete()
    Job.objects.filter(id=done.id).update(completion_tokens=F("completion_tokens") + 10)
    assert check() and len(_counted(api_key)) == 2


def test_the_quota_reads_the_counter_and_the_active_jobs_as_the_day_sum_did(redis_client):
    api_key, _ = make_api_key()
    make_job(api_key=api_key, status=JobStatus.COMPLETED, prompt_tokens=10, completion_tokens=20)
    make_job(api_key=api_key, status=JobStatus.FAILED, prompt_tokens=1, completion_tokens=2)
    make_job(api_key=api_key, prompt_token_ids=[1, 2, 3], params={"max_tokens": 7})  # reserves 3 + 7
    make_job(api_key=api_key, status=JobStatus.IN_PROGRESS, prompt_token_ids=[1], params={"max_tokens": 4})
    make_job(api_key=api_key, status=JobStatus.COMPLETED, prompt_tokens=500, completion_tokens=500,
             created_at=timezone.now() - dt.timedelta(days=1, hours=1))  # an earlier day

    assert api_key_tokens_used_today(api_key=api_key) == 30 + 3 + 10 + 5
    finished_today = (Job.objects.filter(api_key=api_key, created_at__date=timezone.now().date())
                      .exclude(status__in=ACTIVE_STATUSES).aggregate(t=Sum(F("prompt_tokens") + F("completion_tokens"))))
    assert KeyDayTokens.objects.get(api_key=api_key, day=timezone.now().astimezone(dt.UTC).date()).tokens == \
        finished_today["t"] == 33


def test_a_key_with_finished_jobs_can_still_be_deleted(redis_client):
    api_key, _ = make_api_key()
    job = make_job(api_key=api_key, status=JobStatus.COMPLETED, prompt_tokens=3, completion_tokens=4)

    api_key.delete()

    job.refresh_from_db()
    assert job.api_key_id is None and not KeyDayTokens.objects.exists()


def test_the_trigger_knows_the_active_statuses_the_code_uses():
    import importlib

    migration = importlib.import_module("api.migrations.0002_key_day_tokens")
    assert migration.ACTIVE == "(" + ", ".join(f"'{status.value}'" for status in ACTIVE_STATUSES) + ")"
