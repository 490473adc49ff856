"""EngineWorkerService's batch admission: one failing job neither blocks the rest of its batch
nor loops forever between workers."""

from __future__ import annotations

import pytest
from django.db import connection

from api.models import JobStatus
from api.streaming.config import WorkerConfig
from api.streaming.worker import EngineWorkerService
from engine_worker.errors import EngineClosed, InvalidRequest
from tests.api.factories import make_job

pytestmark = pytest.mark.django_db


class FakeHost:
    """Accepts every job except the ones it is told to refuse."""

    def __init__(self, *, invalid: set[str], engine_down: set[str]) -> None:
        self.invalid, self.engine_down = invalid, engine_down
        self.started: list[str] = []

    def submit(self, spec) -> bool:
        if spec.job_id in self.invalid:
            raise InvalidRequest("max_tokens must be positive")
        if spec.job_id in self.engine_down:
            raise EngineClosed("engine stopped")
        self.started.append(spec.job_id)
        return True

    def hand_back(self, job_ids: list[str]) -> list[str]:
        return list(job_ids)

    def holds(self, job_id: str) -> bool:
        return job_id in self.started

    def engine_running(self) -> bool:
        return True


def _service(host, redis_client, *, claim_ahead: int = 0, dispatch=lambda job_id: None) -> EngineWorkerService:
    config = WorkerConfig(worker_id="w1", model_path="", lease_s=30, heartbeat_s=2, drain_s=1,
                          redispatch_after_s=30, stream_interval_s=0, prefetch=16, claim_ahead=claim_ahead)
    return EngineWorkerService(config=config, host=host, redis_client=redis_client, sender=None, dispatch=dispatch)


def test_a_batch_starts_every_good_job_fails_a_bad_one_and_hands_back_on_engine_trouble(redis_client):
    good_a, invalid, down, good_b = (make_job() for _ in range(4))
    host = FakeHost(invalid={str(invalid.id)}, engine_down={str(down.id)})
    dispatched: list[str] = []
    service = _service(host, redis_client, dispatch=dispatched.append)

    service._admit_batch([str(job.id) for job in (good_a, invalid, down, good_b)])

    assert host.started == [str(good_a.id), str(good_b.id)]
    for job in (good_a, invalid, down, good_b):
        job.refresh_from_db()
    assert good_a.status == good_b.status == JobStatus.IN_PROGRESS
    # The job's own fault: it fails alone, with the reason, and is not sent anywhere again.
    assert (invalid.status, invalid.finish_reason) == (JobStatus.FAILED, "error")
    assert "max_tokens" in invalid.error
    # The engine's fault: back in the queue and re-sent at once for another worker.
    assert (down.status, down.worker_id) == (JobStatus.QUEUED, None)
    assert dispatched == [str(down.id)]


class HoldingHost(FakeHost):
    def __init__(self, held: int) -> None:
        super().__init__(invalid=set(), engine_down=set())
        self._held = [f"held-{i}" for i in range(held)]

    def held_jobs(self) -> list[str]:
        return self._held + self.started


@pytest.mark.skipif(connection.vendor != "postgresql", reason="claims ahead on PostgreSQL")
def test_an_admission_claims_ahead_up_to_the_engines_free_room(redis_client):
    delivered, *waiting = (make_job() for _ in range(6))
    host = HoldingHost(held=2)
    service = _service(host, redis_client, claim_ahead=5)

    service._admit_batch([str(delivered.id)])

    # Room for 5, 2 held: the delivered job and 2 more from the queue's head; 3 stay queued.
    assert host.started == [str(delivered.id), str(waiting[0].id), str(waiting[1].id)]
    assert sorted(j.status for j in type(delivered).objects.all()) == ["in_progress"] * 3 + ["queued"] * 3


@pytest.mark.skipif(connection.vendor != "postgresql", reason="claims ahead on PostgreSQL")
def test_the_message_of_a_job_claimed_ahead_costs_no_claim(redis_client, django_assert_num_queries):
    first, second = make_job(), make_job()
    host = HoldingHost(held=0)
    service = _service(host, redis_client, claim_ahead=4)
    service._admit_batch([str(first.id)])
    assert host.started == [str(first.id), str(second.id)]  # the second was claimed ahead

    with django_assert_num_queries(0):  # its own message arrives: nothing left to do
        # and it tells the admission thread so: no claim, so the next claim need not wait
        assert service._admit_batch([str(second.id)]) is False
    assert host.started == [str(first.id), str(second.id)]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="claims ahead on PostgreSQL")
def test_a_wake_up_claims_the_queue_head_up_to_the_free_room_and_a_full_worker_leaves_it(
        redis_client, django_assert_num_queries):
    jobs = [make_job() for _ in range(4)]
    host = HoldingHost(held=1)
    service = _service(host, redis_client, claim_ahead=3)

    assert service._admit_batch([], woken=True) is True  # the database said jobs were queued; no message yet

    assert host.started == [str(jobs[0].id), str(jobs[1].id)]  # room for 3, 1 held
    # Full now: a wake-up costs no query, and the rest stay queued for other workers.
    with django_assert_num_queries(0):
        assert service._admit_batch([], woken=True) is False
    assert sorted(j.status for j in type(jobs[0]).objects.all()) == ["in_progress"] * 2 + ["queued"] * 2
    # Without a wake-up, a batch of messages for jobs already held claims nothing either.
    with django_assert_num_queries(0):
        service._admit_batch([str(jobs[0].id)])


class DeadEngineHost(HoldingHost):
    def engine_running(self) -> bool:
        return False


def test_a_worker_whose_engine_died_claims_nothing_and_sends_delivered_jobs_back(
        redis_client, django_assert_num_queries):
    delivered = make_job()
    make_job()  # queued too: a wake-up would claim it
    dispatched: list[str] = []
    service = _service(DeadEngineHost(held=0), redis_client, claim_ahead=4, dispatch=dispatched.append)

    with django_assert_num_queries(0):
        service._admit_batch([], woken=True)
        service._admit_batch([str(delivered.id)])

    assert dispatched == [str(delivered.id)]  # for another worker; never claimed here
    assert {j.status for j in type(delivered).objects.all()} == {JobStatus.QUEUED}


def test_the_claim_interval_comes_from_the_environment_in_milliseconds(monkeypatch):
    monkeypatch.delenv("WORKER_CLAIM_INTERVAL_MS", raising=False)
    assert WorkerConfig.from_env().claim_interval_s == 0.0  # off unless asked for
    monkeypatch.setenv("WORKER_CLAIM_INTERVAL_MS", "4")
    assert WorkerConfig.from_env().claim_interval_s == pytest.approx(0.004)
    monkeypatch.setenv("WORKER_CLAIM_INTERVAL_MS", "12.5")
    assert WorkerConfig.from_env().claim_interval_s == pytest.approx(0.0125)
