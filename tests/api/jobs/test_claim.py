"""The batch claim: one statement takes the job a message names and every other queued job of the
worker's model that it has room for; the others' messages then find them claimed."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from api.jobs.services import claim as claims
from api.models import Job, JobStatus
from tests.api.factories import make_job

pytestmark = pytest.mark.django_db


def _queued(n: int, **fields) -> list:
    start = timezone.now() - dt.timedelta(minutes=10)
    return [make_job(model="tiny", dispatch_count=1, queued_at=start + dt.timedelta(seconds=i), **fields)
            for i in range(n)]


def test_a_batch_claim_takes_the_named_job_first_then_the_queue_in_order_in_one_statement():
    first, second, third = _queued(3)
    urgent = make_job(model="tiny", dispatch_count=1, priority=-1)
    named = make_job(model="tiny", dispatch_count=1)

    with CaptureQueriesContext(connection) as queries:
        jobs = claims.jobs_claim(job_id=str(named.id), worker_id="w", lease_s=30, model="tiny", limit=4)

    assert len(queries) == 1
    assert [j.id for j in jobs] == [named.id, urgent.id, first.id, second.id]
    assert all((j.status, j.worker_id, j.attempts) == (JobStatus.IN_PROGRESS, "w", 1) for j in jobs)
    third.refresh_from_db()
    assert third.status == JobStatus.QUEUED  # past the limit


def test_a_batch_claim_leaves_what_is_not_this_workers_to_take():
    named = make_job(model="tiny", dispatch_count=1)
    others = [
        make_job(model="other", dispatch_count=1),  # another model's
        make_job(model="tiny", dispatch_count=1, cancel_requested=True),
        make_job(model="tiny", dispatch_count=1, routed_worker="w2"),  # routed to another worker
        make_job(model="tiny", dispatch_count=0),  # never sent: a batch's job the feeder holds back
        make_job(model="tiny", dispatch_count=1, status=JobStatus.IN_PROGRESS, worker_id="w2"),
    ]
    mine = make_job(model="tiny", dispatch_count=1, routed_worker="w")

    jobs = claims.jobs_claim(job_id=str(named.id), worker_id="w", lease_s=30, model="tiny", limit=50)

    assert [j.id for j in jobs] == [named.id, mine.id]
    for job in others:
        status = job.status
        job.refresh_from_db()
        assert (job.status, job.attempts) == (status, 0)


def test_a_claim_of_one_takes_only_the_named_job_and_a_claimed_one_takes_nothing_of_it():
    a, b = _queued(2)
    assert [j.id for j in claims.jobs_claim(job_id=str(a.id), worker_id="w", lease_s=30, model="tiny", limit=1)] \
        == [a.id]
    assert [j.id for j in claims.jobs_claim(job_id=str(a.id), worker_id="w2", lease_s=30, model="tiny", limit=1)] \
        == []  # a duplicate message for a claimed job, with no room for others: a no-op
    assert [j.id for j in claims.jobs_claim(job_id=str(a.id), worker_id="w2", lease_s=30, model="tiny", limit=2)] \
        == [b.id]  # with room, it takes the queue's next job; a stays with w
    a.refresh_from_db()
    assert a.worker_id == "w"


@pytest.mark.django_db(transaction=True)
def test_workers_claiming_at_once_take_each_job_once():
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections

    jobs = _queued(24)

    def claim(worker: str) -> list[str]:
        try:
            taken = []
            for job in jobs:  # every message, as each worker's consumer would get them
                taken += [str(j.id) for j in claims.jobs_claim(job_id=str(job.id), worker_id=worker, lease_s=30,
                                                               model="tiny", limit=5)]
            return taken
        finally:
            connections.close_all()

    with ThreadPoolExecutor(3) as pool:
        taken = list(pool.map(claim, ["w1", "w2", "w3"]))

    every = [job_id for worker in taken for job_id in worker]
    assert sorted(every) == sorted(str(job.id) for job in jobs)  # each once, none left
    for worker, ids in zip(["w1", "w2", "w3"], taken, strict=True):
        assert set(ids) == {str(j.id) for j in Job.objects.filter(worker_id=worker, attempts=1)}
