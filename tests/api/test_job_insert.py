"""A submission's INSERT and queue position travel as one prepared statement."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.db.models import signals
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from api.models import Job, JobStatus
from api.selectors.jobs import job_queue_position
from api.services.job_insert import job_insert
from tests.api.factories import make_api_key, make_job

pytestmark = pytest.mark.django_db


def _new_job(api_key, **overrides) -> Job:
    fields = {"owner": api_key.owner, "api_key": api_key, "prompt": "hé", "prompt_token_ids": [1, 2, 3],
              "params": {"max_tokens": 4, "stop": ["\n"]}, "messages": [{"role": "user", "content": "hé"}],
              "priority": 10, "request_fingerprint": "f" * 64, "dispatch_count": 1}
    return Job(**{**fields, **overrides})


def test_the_row_holds_what_the_instance_holds():
    api_key, _ = make_api_key()
    job = _new_job(api_key)

    job_insert(job)

    stored = Job.objects.get(id=job.id)
    assert model_to_dict(stored) == model_to_dict(job)
    assert (stored.created_at, stored.queued_at) == (job.created_at, job.queued_at)
    assert not job._state.adding and job._state.db == "default"  # as after Model.save()


def test_the_position_is_the_selectors_count_of_jobs_ahead():
    api_key, _ = make_api_key()
    now = timezone.now()
    make_job(api_key=api_key, priority=5, queued_at=now + dt.timedelta(seconds=5))  # more urgent: ahead
    make_job(api_key=api_key, priority=10, queued_at=now - dt.timedelta(seconds=5))  # earlier: ahead
    make_job(api_key=api_key, priority=10, queued_at=now - dt.timedelta(seconds=5), status=JobStatus.IN_PROGRESS)
    make_job(api_key=api_key, priority=20, queued_at=now - dt.timedelta(seconds=5))  # less urgent: behind
    job = _new_job(api_key, priority=10, queued_at=now)

    position = job_insert(job)

    assert position == 2 == job_queue_position(job=job)


def test_a_submission_runs_no_separate_count_and_no_orm_insert(api_client):
    with CaptureQueriesContext(connection) as queries:
        response = api_client.post("/api/v1/jobs", {"prompt": "Hello", "max_tokens": 4}, format="json")

    assert response.status_code == 202
    assert response.json()["queue_position"] == 0
    statements = [q["sql"].lstrip().split()[0].upper() for q in queries.captured_queries]
    inserts = [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith("INSERT")]
    assert len(inserts) == 1 and "RETURNING (SELECT COUNT(*)" in inserts[0]
    assert not any(q["sql"].lstrip().upper().startswith("SELECT COUNT(*)") for q in queries.captured_queries), statements


def test_nothing_listens_to_job_save_signals():
    # job_insert sends no pre_save/post_save; a receiver added for Job would silently miss inserts.
    assert not signals.pre_save.has_listeners(Job)
    assert not signals.post_save.has_listeners(Job)

