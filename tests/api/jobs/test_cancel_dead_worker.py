"""A running job cancelled while its worker is stuck, whose worker then dies or hands it back,
ends cancelled: it never waits in the queue (where nothing takes a cancel-requested job), counted
against its key's concurrent jobs, until it expires."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from api.common.redis_keys import job_stream_key
from api.jobs import tasks
from api.jobs.services import claim as claims
from api.jobs.services import lifecycle as lc
from api.jobs.services import outputs, reconciler
from api.jobs.services.cancel import job_cancel
from api.models import Job, JobStatus
from tests.api.factories import make_job


@pytest.fixture
def no_broker(monkeypatch):
    sent: list[str] = []
    monkeypatch.setattr(reconciler, "job_dispatch", lambda *, job_id: sent.append(job_id))
    monkeypatch.setattr(reconciler, "engine_queues_declare", lambda: None)
    return sent


def _running_on_a_stuck_worker(api_key=None, **fields) -> Job:
    job = make_job(api_key=api_key, **fields)
    claims.job_claim(job_id=str(job.id), worker_id="stuck", lease_s=30)
    Job.objects.filter(id=job.id).update(output_text="partial", completion_tokens=3, last_seq=3)
    job_cancel(job_id=job.id)  # the worker never acts on it
    return Job.objects.get(id=job.id)


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_job_whose_worker_died_ends_cancelled_and_frees_its_keys_slot(
        api_client, api_key, no_broker, redis_client):
    type(api_key).objects.filter(id=api_key.id).update(max_concurrent_jobs=1)
    job = _running_on_a_stuck_worker(api_key=api_key)
    assert job.status == JobStatus.IN_PROGRESS and job.cancel_requested
    assert api_client.post("/api/v1/jobs", {"prompt": "hi", "max_tokens": 4}, format="json").status_code == 429
    Job.objects.filter(id=job.id).update(lease_expires_at=timezone.now() - dt.timedelta(seconds=1))  # it died

    assert tasks.reconcile_jobs() == {"requeued": 0, "cancelled": 1, "dispatched": 0}

    job.refresh_from_db()
    assert (job.status, job.finish_reason, job.output_text, job.completion_tokens) == (
        JobStatus.CANCELLED, "abort", "partial", 3)
    assert job.finished_at is not None and job.lease_expires_at is None
    assert no_broker == []  # never sent to a worker again
    # Its watchers are told, from the row.
    [(_, entry)] = redis_client.xrange(job_stream_key(str(job.id)))
    assert json.loads(entry["data"])["status"] == "cancelled"
    assert api_client.post("/api/v1/jobs", {"prompt": "hi", "max_tokens": 4}, format="json").status_code == 202
    assert tasks.reconcile_jobs() == {"requeued": 0, "cancelled": 0, "dispatched": 0}


@pytest.mark.django_db
def test_a_job_handed_back_on_shutdown_after_its_cancel_was_requested_ends_cancelled():
    job = _running_on_a_stuck_worker()
    assert lc.job_hand_back(job_id=str(job.id), worker_id="stuck", redispatch_after_s=5) == JobStatus.CANCELLED
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    assert claims.job_claim(job_id=str(job.id), worker_id="w2", lease_s=30) is None


@pytest.mark.django_db
def test_a_job_handed_back_without_a_cancel_goes_back_to_the_queue():
    job = make_job()
    claims.job_claim(job_id=str(job.id), worker_id="w1", lease_s=30)
    assert lc.job_hand_back(job_id=str(job.id), worker_id="w1", redispatch_after_s=5) == JobStatus.QUEUED
    assert lc.job_hand_back(job_id=str(job.id), worker_id="w1", redispatch_after_s=5) is None
    job.refresh_from_db()
    assert (job.status, job.worker_id) == (JobStatus.QUEUED, None)


@pytest.mark.django_db
def test_a_job_handed_back_and_then_cancelled_in_the_queue_keeps_its_text_with_its_first_token_time():
    job = make_job()
    claims.job_claim(job_id=str(job.id), worker_id="w1", lease_s=30)
    outputs.jobs_record_progress(worker_id="w1", progress=[
        outputs.Progress(job_id=str(job.id), text="partial", last_seq=2, completion_tokens=3, first_token_at=1_800_000_000.0)])
    assert lc.job_hand_back(job_id=str(job.id), worker_id="w1", redispatch_after_s=5) == JobStatus.QUEUED

    job_cancel(job_id=job.id)

    job.refresh_from_db()
    assert (job.status, job.output_text) == (JobStatus.CANCELLED, "partial")
    assert job.first_token_at.timestamp() == 1_800_000_000.0


@pytest.mark.django_db
def test_the_next_claim_of_a_handed_back_job_clears_its_text_and_first_token_time_together():
    job = make_job()
    claims.job_claim(job_id=str(job.id), worker_id="w1", lease_s=30)
    outputs.jobs_record_progress(worker_id="w1", progress=[
        outputs.Progress(job_id=str(job.id), text="partial", last_seq=2, completion_tokens=3, first_token_at=1_800_000_000.0)])
    lc.job_hand_back(job_id=str(job.id), worker_id="w1", redispatch_after_s=5)

    claimed = claims.job_claim(job_id=str(job.id), worker_id="w2", lease_s=30)

    assert (claimed.output_text, claimed.first_token_at, claimed.completion_tokens) == ("", None, 0)


@pytest.mark.django_db(transaction=True)
def test_migration_0009_ends_jobs_left_queued_with_their_cancel_requested():
    executor = MigrationExecutor(connection)
    executor.migrate([("api", "0010_job_output_text_lossless")])
    try:
        old = MigrationExecutor(connection).loader.project_state([("api", "0010_job_output_text_lossless")]).apps
        OldJob, OldUser = old.get_model("api", "Job"), old.get_model("auth", "User")  # noqa: N806
        owner = OldUser.objects.create(username="before-0009")
        stuck, waiting = (OldJob.objects.create(owner=owner, status="queued", cancel_requested=flag,
                                                prompt_token_ids=[1], params={}).id for flag in (True, False))
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert Job.objects.get(id=stuck).status == JobStatus.CANCELLED
    assert Job.objects.get(id=waiting).status == JobStatus.QUEUED

