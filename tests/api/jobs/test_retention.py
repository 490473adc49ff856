"""JOB_RETENTION_DAYS: the hourly purge deletes finished jobs that old, and nothing a quota, the
usage roll-up or a running job still needs."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from api.jobs import tasks
from api.jobs.services.deletion import jobs_purge_finished
from api.keys.quotas import quota_key_usage
from api.models import Job, JobStatus, UsageRecord
from tests.api.factories import make_api_key, make_job
from tests.inference_service.test_project import _settings_in_subprocess

pytestmark = pytest.mark.django_db


def _ended(api_key, days_ago: float, status=JobStatus.COMPLETED) -> Job:
    at = timezone.now() - dt.timedelta(days=days_ago)
    return make_job(api_key=api_key, status=status, created_at=at, queued_at=at, finished_at=at,
                    prompt_tokens=3, completion_tokens=5)


def test_the_purge_deletes_finished_jobs_older_than_the_retention_and_keeps_the_rest(redis_client):
    api_key, _ = make_api_key()
    old = [_ended(api_key, 10), _ended(api_key, 4, JobStatus.FAILED), _ended(api_key, 3.5, JobStatus.CANCELLED)]
    recent = [_ended(api_key, 2.5), _ended(api_key, 0)]
    # Still queued or running, however old: never purged (the expiry and the reconciler own them).
    active = [make_job(api_key=api_key, created_at=timezone.now() - dt.timedelta(days=9)),
              make_job(api_key=api_key, status=JobStatus.IN_PROGRESS, worker_id="w",
                       created_at=timezone.now() - dt.timedelta(days=9))]
    record = UsageRecord.objects.create(api_key=api_key, owner=api_key.owner, day=(timezone.now() - dt.timedelta(days=10)).date(),
                                        requests=1, prompt_tokens=3, completion_tokens=5)

    assert jobs_purge_finished(older_than_days=3) == 3

    remaining = set(Job.objects.values_list("id", flat=True))
    assert remaining == {j.id for j in recent + active}
    assert not remaining & {j.id for j in old}
    assert UsageRecord.objects.get(id=record.id).completion_tokens == 5  # the day's usage stays
    assert jobs_purge_finished(older_than_days=3) == 0


def test_the_purge_works_in_batches(monkeypatch, redis_client):
    api_key, _ = make_api_key()
    for _ in range(5):
        _ended(api_key, 9)
    monkeypatch.setattr("api.jobs.services.deletion.PURGE_BATCH", 2)

    assert jobs_purge_finished(older_than_days=2) == 5 and not Job.objects.exists()


def test_the_purge_leaves_what_todays_quota_counts(redis_client):
    api_key, _ = make_api_key()
    for days_ago in (0, 0.9, 30):
        _ended(api_key, days_ago)
    before = quota_key_usage(api_key=api_key, now=timezone.now())

    assert jobs_purge_finished(older_than_days=2) == 1

    assert quota_key_usage(api_key=api_key, now=timezone.now()) == before


def test_a_retention_under_two_days_is_refused():
    with pytest.raises(ValueError, match="at least 2 days"):
        jobs_purge_finished(older_than_days=1)
    result = _settings_in_subprocess({"JOB_RETENTION_DAYS": "1"}, "s.JOB_RETENTION_DAYS")
    assert result.returncode != 0 and "JOB_RETENTION_DAYS=1" in result.stderr
    assert _settings_in_subprocess({"JOB_RETENTION_DAYS": "7"}, "s.JOB_RETENTION_DAYS").stdout.strip() == "7"


def test_the_beat_task_keeps_every_job_by_default_and_purges_with_a_retention(settings, redis_client):
    api_key, _ = make_api_key()
    job = _ended(api_key, 400)
    settings.JOB_RETENTION_DAYS = 0
    assert tasks.purge_jobs() == 0 and Job.objects.filter(id=job.id).exists()

    settings.JOB_RETENTION_DAYS = 30
    assert tasks.purge_jobs() == 1 and not Job.objects.filter(id=job.id).exists()
