"""Worker-side job transitions: conditional UPDATEs that make duplicates and late workers no-ops."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.db import connection
from django.utils import timezone

from api.jobs.services import claim as claims
from api.jobs.services import lifecycle as lc
from api.jobs.services import outputs
from api.models import JobStatus
from engine_worker.protocol import FinalResult
from tests.api.factories import make_job

pytestmark = pytest.mark.django_db


def final(job, reason="length", text="hello", **kw) -> FinalResult:
    return FinalResult(job_id=str(job.id), text=text, finish_reason=reason, prompt_tokens=3,
                       completion_tokens=5, finished_at=time.time(), last_seq=2, **kw)


def test_a_job_is_claimed_once_and_a_duplicate_claim_gets_nothing():
    job = make_job()
    claimed = claims.job_claim(job_id=str(job.id), worker_id="w1", lease_s=30)
    assert claimed.status == JobStatus.IN_PROGRESS and claimed.worker_id == "w1"
    assert claimed.lease_expires_at > timezone.now() and claimed.started_at is not None
    assert claims.job_claim(job_id=str(job.id), worker_id="w2", lease_s=30) is None
    job.refresh_from_db()
    assert job.worker_id == "w1"


def test_a_cancelled_job_is_never_claimed():
    job = make_job(cancel_requested=True)
    assert claims.job_claim(job_id=str(job.id), worker_id="w1", lease_s=30) is None
    assert claims.job_claim(job_id=str(make_job(status=JobStatus.CANCELLED).id), worker_id="w1", lease_s=30) is None


def test_spec_carries_the_tokens_and_sampling_of_the_job():
    job = make_job(params={"max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 4, "min_p": 0.1,
                           "repetition_penalty": 1.1, "seed": 3, "stop": ["\n\n"]}, priority=2)
    spec = claims.job_spec(job)
    assert (spec.job_id, spec.prompt_token_ids, spec.max_tokens) == (str(job.id), (1, 2, 3), 7)
    assert (spec.temperature, spec.top_p, spec.top_k, spec.min_p) == (0.5, 0.9, 4, 0.1)
    assert (spec.repetition_penalty, spec.seed, spec.stop, spec.priority) == (1.1, 3, ("\n\n",), 2)


def test_a_setting_the_row_lacks_runs_with_the_services_default_as_a_submission_would_store_it(settings):
    settings.DEFAULT_MAX_TOKENS = 100
    spec = claims.job_spec(make_job(params={"temperature": 0.5, "seed": None}))
    assert (spec.max_tokens, spec.temperature, spec.top_p, spec.top_k, spec.seed) == (100, 0.5, 1.0, 0, None)
    assert (spec.stop, spec.logit_bias, spec.logprobs) == ((), (), None)


def test_finish_records_text_and_usage_only_for_the_worker_that_holds_the_job():
    job = make_job()
    claims.job_claim(job_id=str(job.id), worker_id="w1", lease_s=30)
    assert not outputs.jobs_complete(results=[final(job)], worker_id="w-late")
    assert outputs.jobs_complete(results=[final(job)], worker_id="w1")
    job.refresh_from_db()
    assert (job.status, job.output_text, job.completion_tokens, job.last_seq) == (JobStatus.COMPLETED, "hello", 5, 2)
    assert job.lease_expires_at is None and job.finished_at is not None
    assert not outputs.jobs_complete(results=[final(job, text="again")], worker_id="w1")  # duplicate final


@pytest.mark.parametrize(("reason", "status"), [("stop", JobStatus.COMPLETED), ("error", JobStatus.FAILED),
                                                ("abort", JobStatus.CANCELLED)])
def test_finish_reason_decides_the_status(reason, status):
    job = make_job()
    claims.job_claim(job_id=str(job.id), worker_id="w1", lease_s=30)
    result = final(job, reason=reason, error="boom" if reason == "error" else None)
    outputs.jobs_complete(results=[result], worker_id="w1")
    job.refresh_from_db()
    assert job.status == status and job.finish_reason == reason


def test_the_finals_of_a_batch_are_written_together_each_as_job_complete_would():
    from django.test.utils import CaptureQueriesContext

    done, aborted, stopped_by_cancel, lost = make_job(), make_job(), make_job(), make_job()
    for job in (done, aborted, stopped_by_cancel, lost):
        claims.job_claim(job_id=str(job.id), worker_id="w1", lease_s=30)
    type(lost).objects.filter(id=lost.id).update(worker_id="w2")  # handed on: w1's final is late
    # A cancel already moved this one to cancelled; its abort final still brings text and usage.
    type(stopped_by_cancel).objects.filter(id=stopped_by_cancel.id).update(status=JobStatus.CANCELLED)
    finals = [final(done, text="all of it"), final(aborted, reason="abort", text="part"),
              final(stopped_by_cancel, reason="abort", text="so far"), final(lost, text="late")]
    with CaptureQueriesContext(connection) as queries:
        # It names the jobs whose finals it stored: only those may be published.
        assert sorted(outputs.jobs_complete(results=finals, worker_id="w1")) == sorted(
            str(job.id) for job in (done, aborted, stopped_by_cancel))
    updates = [q["sql"] for q in queries.captured_queries if "UPDATE" in q["sql"].upper()]
    if connection.vendor == "postgresql":
        assert len(updates) == 1 and "FROM (VALUES" in updates[0]  # one statement for the batch, not one per final
    for job in (done, aborted, stopped_by_cancel, lost):
        job.refresh_from_db()
    assert (done.status, done.output_text, done.finish_reason, done.completion_tokens) == (
        JobStatus.COMPLETED, "all of it", "length", 5)
    assert done.lease_expires_at is None and done.finished_at is not None and done.last_seq == 2
    assert (aborted.status, aborted.output_text) == (JobStatus.CANCELLED, "part")
    assert (stopped_by_cancel.status, stopped_by_cancel.output_text, stopped_by_cancel.prompt_tokens) == (
        JobStatus.CANCELLED, "so far", 3)
    assert (lost.status, lost.output_text, lost.finished_at) == (JobStatus.IN_PROGRESS, "", None)
    # A second delivery of the same finals changes nothing but the cancelled ones' text again.
    assert outputs.jobs_complete(results=finals[:1], worker_id="w1") == []


def test_the_final_brings_the_first_token_time_when_the_row_has_none():
    # A one-token job (or batches the output process merged) sends its first token with its final.
    alone, recorded = make_job(), make_job()
    for job in (alone, recorded):
        claims.job_claim(job_id=str(job.id), worker_id="w1", lease_s=30)
    outputs.jobs_record_progress(worker_id="w1", progress=[
        outputs.Progress(job_id=str(recorded.id), text="a", last_seq=1, completion_tokens=1, first_token_at=1_800_000_000.0)])
    finals = [final(job, first_token_at=1_800_000_001.0) for job in (alone, recorded)]
    assert len(outputs.jobs_complete(results=finals, worker_id="w1")) == 2
    for job in (alone, recorded):
        job.refresh_from_db()
    assert alone.first_token_at.timestamp() == 1_800_000_001.0
    assert recorded.first_token_at.timestamp() == 1_800_000_000.0  # the row's own is kept


def test_a_cancelled_job_keeps_its_status_when_a_non_abort_final_arrives():
    job = make_job()
    claims.job_claim(job_id=str(job.id), worker_id="w1", lease_s=30)
    type(job).objects.filter(id=job.id).update(status=JobStatus.CANCELLED)
    assert outputs.jobs_complete(results=[final(job, reason="length")], worker_id="w1") == []
    job.refresh_from_db()
    assert (job.status, job.output_text) == (JobStatus.CANCELLED, "")


def test_an_abort_final_arriving_after_its_owner_deleted_the_cancelled_job_writes_nothing():
    job = make_job()
    claims.job_claim(job_id=str(job.id), worker_id="w1", lease_s=30)
    type(job).objects.filter(id=job.id).update(status=JobStatus.CANCELLED, prompt="", deleted_at=timezone.now())

    assert outputs.jobs_complete(results=[final(job, reason="abort", text="secret")], worker_id="w1") == []
    assert outputs.jobs_complete(results=[final(job, reason="abort", text="secret"), final(make_job(), reason="abort")],
                            worker_id="w1") == []  # the batch form too
    job.refresh_from_db()
    assert (job.status, job.output_text, job.completion_tokens) == (JobStatus.CANCELLED, "", 0)


def test_requeue_by_lease_only_after_the_lease_expired():
    job = make_job()
    claims.job_claim(job_id=str(job.id), worker_id="w1", lease_s=30)
    assert not lc.job_hand_back(job_id=str(job.id), worker_id=None, redispatch_after_s=0)
    assert lc.job_renew_leases(worker_id="w1", job_ids=[str(job.id)], lease_s=30) == 1
    type(job).objects.filter(id=job.id).update(lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert lc.jobs_with_expired_lease() == [str(job.id)]
    assert lc.job_hand_back(job_id=str(job.id), worker_id=None, redispatch_after_s=0)
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED and job.worker_id is None
    # The dead worker's late final changes nothing.
    assert not outputs.jobs_complete(results=[final(job)], worker_id="w1")


def test_a_progress_write_records_the_first_token_time_once():
    job = make_job()
    claims.job_claim(job_id=str(job.id), worker_id="w1", lease_s=30)
    for seq, at in ((1, 1_800_000_000.0), (2, 1_800_000_005.0), (3, None)):
        outputs.jobs_record_progress(worker_id="w1", progress=[
            outputs.Progress(job_id=str(job.id), text="x" * seq, last_seq=seq, completion_tokens=seq, first_token_at=at)])
        job.refresh_from_db()
        assert job.first_token_at.timestamp() == 1_800_000_000.0 and job.last_seq == seq


def test_queued_jobs_need_dispatch_only_after_their_claim_deadline():
    fresh = make_job()
    old = make_job(queued_at=timezone.now() - dt.timedelta(seconds=120))
    assert lc.jobs_needing_dispatch(queued_grace_s=60) == [str(old.id)]
    assert lc.job_mark_dispatched(job_id=str(old.id), redispatch_after_s=60)
    assert lc.jobs_needing_dispatch(queued_grace_s=60) == []
    old.refresh_from_db()
    assert old.dispatch_count == 1 and fresh.dispatch_count == 0


def test_reconciler_requeues_expired_leases_and_redispatches_lost_jobs(monkeypatch):
    from api.jobs import tasks
    from api.jobs.services import reconciler

    sent: list[str] = []
    monkeypatch.setattr(reconciler, "job_dispatch", lambda *, job_id: sent.append(job_id))
    monkeypatch.setattr(reconciler, "engine_queues_declare", lambda: None)
    dead = make_job()
    claims.job_claim(job_id=str(dead.id), worker_id="dead", lease_s=30)
    type(dead).objects.filter(id=dead.id).update(lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    lost = make_job(queued_at=timezone.now() - dt.timedelta(seconds=600))
    make_job()  # just queued: its message is still on its way
    assert tasks.reconcile_jobs() == {"requeued": 1, "cancelled": 0, "dispatched": 2}
    assert sorted(sent) == sorted([str(dead.id), str(lost.id)])
    assert tasks.reconcile_jobs() == {"requeued": 0, "cancelled": 0, "dispatched": 0}  # not again before the deadline


def test_expire_jobs_expires_only_long_queued_jobs(settings):
    from api.jobs import tasks

    settings.JOB_QUEUE_TIMEOUT_S = 60
    stale = make_job(queued_at=timezone.now() - dt.timedelta(seconds=120), prompt_tokens=3)
    fresh = make_job(prompt_tokens=3)
    assert tasks.expire_jobs() == 1
    stale.refresh_from_db()
    fresh.refresh_from_db()
    assert (stale.status, fresh.status) == (JobStatus.EXPIRED, JobStatus.QUEUED)
    assert (stale.prompt_tokens, fresh.prompt_tokens) == (0, 3)  # an expired job never ran: nothing charged


def test_progress_of_several_running_jobs_is_written_in_one_update():
    a, b, other = make_job(), make_job(), make_job()
    for job in (a, b):
        claims.job_claim(job_id=str(job.id), worker_id="w1", lease_s=30)
    claims.job_claim(job_id=str(other.id), worker_id="w2", lease_s=30)
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        written = outputs.jobs_record_progress(worker_id="w1", progress=[
            outputs.Progress(job_id=str(a.id), text="Once", last_seq=1, completion_tokens=1, first_token_at=1_800_000_000.0),
            outputs.Progress(job_id=str(b.id), text="Hello there", last_seq=3, completion_tokens=4),
            outputs.Progress(job_id=str(other.id), text="not mine", last_seq=1, completion_tokens=1,
                        first_token_at=1_800_000_000.0),
        ])
    assert written == 2
    [update] = [q["sql"] for q in queries.captured_queries if "UPDATE" in q["sql"].upper()]
    assert "FROM (VALUES" in update if connection.vendor == "postgresql" else update.startswith("3 times: ")
    for job in (a, b, other):
        job.refresh_from_db()
    assert (a.output_text, a.last_seq, a.completion_tokens) == ("Once", 1, 1)
    assert a.first_token_at.timestamp() == 1_800_000_000.0
    assert (b.output_text, b.last_seq, b.completion_tokens, b.first_token_at) == ("Hello there", 3, 4, None)
    assert (other.output_text, other.first_token_at) == ("", None)


def test_a_claim_counts_attempts_clears_the_earlier_text_and_keeps_its_last_seq():
    job = make_job(attempts=1, output_text="old", completion_tokens=4, last_seq=4)
    claimed = claims.job_claim(job_id=str(job.id), worker_id="w1", lease_s=30)
    assert (claimed.attempts, claimed.output_text, claimed.completion_tokens) == (2, "", 0)
    assert claimed.last_seq == 4  # the new attempt's stream goes on after it (api/worker/admission.py)
    assert (claimed.status, claimed.worker_id) == (JobStatus.IN_PROGRESS, "w1")


