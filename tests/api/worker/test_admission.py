"""EngineWorkerService.admit: one delivered job claimed and started; a failing job fails alone, the
engine's trouble sends it back; a job that runs again restarts its stream."""

from __future__ import annotations

import pytest

from api.common.redis_keys import job_stream_key
from api.models import JobStatus
from api.streaming import messages
from api.worker.config import WorkerConfig
from api.worker.service import EngineWorkerService
from engine_worker.common.errors import EngineClosed, InvalidRequest
from engine_worker.protocol import OutputChunk
from engine_worker.runtime import JobHost, MemorySink
from tests.api.factories import make_job

pytestmark = pytest.mark.django_db


class FakeEngine:
    """The part of EngineCore a JobHost drives; refuses the jobs it is told to."""

    def __init__(self, *, invalid: set[str] = frozenset(), down: set[str] = frozenset(), running: bool = True,
                 capacity: int = 0) -> None:
        self.invalid, self.down, self.running, self.capacity = invalid, down, running, capacity
        self.started: list = []
        self.hand_overs: list[int] = []  # the size of each submit_many

    def add_output_listener(self, fn) -> None:
        pass

    def submit(self, request) -> None:
        if request.request_id in self.invalid:
            raise InvalidRequest("max_tokens must be positive")
        if request.request_id in self.down:
            raise EngineClosed("engine stopped")
        self.started.append(request)

    def submit_many(self, requests) -> list:
        self.hand_overs.append(len(requests))
        errors = []
        for request in requests:
            try:
                self.submit(request)
                errors.append(None)
            except Exception as exc:  # noqa: BLE001 - handed back as EngineCore does
                errors.append(exc)
        return errors

    def abort(self, request_id: str) -> None:
        pass

    def get_stats(self) -> dict:
        return {"max_running": self.capacity}

    def get_cache_stats(self) -> None:
        return None

    def is_running(self) -> bool:
        return self.running


def _service(engine: FakeEngine, redis_client, dispatch=lambda job_id: None) -> EngineWorkerService:
    config = WorkerConfig(worker_id="w1", model_path="tiny", model_name="tiny", lease_s=30, heartbeat_s=2, drain_s=1,
                          redispatch_after_s=30, stream_interval_s=0, prefetch=16)
    return EngineWorkerService(config=config,
                               make_host=lambda sink, on_tick, on_refused: JobHost(engine, sink, on_refused=on_refused),
                               sink=MemorySink(), redis_client=redis_client, dispatch=dispatch)


def test_a_good_job_starts_a_bad_one_fails_alone_and_engine_trouble_hands_back(redis_client):
    good, invalid, down = make_job(), make_job(), make_job()
    engine = FakeEngine(invalid={str(invalid.id)}, down={str(down.id)})
    dispatched: list[str] = []
    service = _service(engine, redis_client, dispatch=dispatched.append)

    assert [service.admit(str(job.id)) for job in (good, invalid, down)] == [True, False, False]

    assert [r.request_id for r in engine.started] == [str(good.id)]
    for job in (good, invalid, down):
        job.refresh_from_db()
    assert (good.status, good.worker_id, good.attempts) == (JobStatus.IN_PROGRESS, "w1", 1)
    # The job's own fault: it fails alone, with the reason, and is not sent anywhere again.
    assert (invalid.status, invalid.finish_reason) == (JobStatus.FAILED, "error")
    assert "max_tokens" in invalid.error
    # The engine's fault: back in the queue and re-sent at once for another worker.
    assert (down.status, down.worker_id) == (JobStatus.QUEUED, None)
    assert dispatched == [str(down.id)]


def test_one_message_starts_every_queued_job_the_engine_has_room_for_in_one_hand_over(
        redis_client, django_assert_num_queries):
    jobs = [make_job(model="tiny", dispatch_count=1) for _ in range(6)]
    engine = FakeEngine(capacity=4)
    service = _service(engine, redis_client)

    assert service.admit(str(jobs[5].id)) is True

    assert engine.hand_overs == [4]  # one claim, one hand-over, up to the batch's room
    assert [r.request_id for r in engine.started][0] == str(jobs[5].id)  # the message's own job first
    claimed = {r.request_id for r in engine.started}
    with django_assert_num_queries(0):  # the others' messages: held here already, no claim
        assert not any(service.admit(str(job.id)) for job in jobs if str(job.id) in claimed)
    # No room left: a message claims its own job alone, nothing more.
    rest = [job for job in jobs if str(job.id) not in claimed]
    assert service.admit(str(rest[0].id)) is True
    assert engine.hand_overs == [4, 1]
    rest[1].refresh_from_db()
    assert rest[1].status == JobStatus.QUEUED


def test_a_duplicate_delivery_or_a_cancelled_job_starts_nothing(redis_client, django_assert_num_queries):
    job, cancelled = make_job(), make_job(status=JobStatus.CANCELLED)
    engine = FakeEngine()
    service = _service(engine, redis_client)
    assert service.admit(str(job.id)) is True

    with django_assert_num_queries(0):  # held here already: not even a claim
        assert service.admit(str(job.id)) is False
    assert service.admit(str(cancelled.id)) is False
    assert [r.request_id for r in engine.started] == [str(job.id)]


def test_a_worker_runs_no_other_models_job_and_sends_it_on_to_that_models_queue(redis_client):
    other, cancelled = make_job(model="tiny-b"), make_job(model="tiny-b", status=JobStatus.CANCELLED)
    engine = FakeEngine()
    dispatched: list[str] = []
    service = _service(engine, redis_client, dispatch=dispatched.append)

    assert service.admit(str(other.id)) is False
    assert service.admit(str(cancelled.id)) is False

    other.refresh_from_db()
    assert (other.status, other.worker_id, other.attempts) == (JobStatus.QUEUED, None, 0)
    assert engine.started == [] and dispatched == [str(other.id)]  # the ended one is not sent on


def test_a_worker_whose_engine_died_claims_nothing_and_sends_delivered_jobs_back(
        redis_client, django_assert_num_queries):
    delivered = make_job()
    dispatched: list[str] = []
    service = _service(FakeEngine(running=False), redis_client, dispatch=dispatched.append)

    with django_assert_num_queries(0):
        assert service.admit(str(delivered.id)) is False

    assert dispatched == [str(delivered.id)]  # for another worker; never claimed here
    delivered.refresh_from_db()
    assert delivered.status == JobStatus.QUEUED


def test_a_job_that_runs_again_restarts_its_stream_after_every_earlier_seq(redis_client):
    # Its first worker died: the stream holds 5 chunks, the row's last progress write saw 3.
    job = make_job(attempts=1, last_seq=3, output_text="abc")
    key = job_stream_key(str(job.id))
    for seq in range(1, 6):
        redis_client.xadd(key, messages.chunk_entry(OutputChunk(job_id=str(job.id), seq=seq, text="x",
                                                                completion_tokens=seq)))
    service = _service(FakeEngine(), redis_client)
    specs = []
    service.host.submit_many = lambda batch: specs.extend(batch) or [s.job_id for s in batch]

    assert service.admit(str(job.id)) is True

    assert [fields for _, fields in redis_client.xrange(key)] == [{"type": "reset", "seq": "6"}]
    assert specs[0].first_seq == 7  # its chunks go on after the reset
    job.refresh_from_db()
    assert (job.attempts, job.output_text) == (2, "")


def test_a_first_attempt_leaves_the_stream_alone(redis_client):
    job = make_job()
    _service(FakeEngine(), redis_client).admit(str(job.id))
    assert not redis_client.exists(job_stream_key(str(job.id)))


def test_a_job_whose_first_attempt_streamed_nothing_starts_again_at_seq_one(redis_client):
    job = make_job(attempts=1)  # its worker died before the first chunk
    service = _service(FakeEngine(), redis_client)
    specs = []
    service.host.submit_many = lambda batch: specs.extend(batch) or [s.job_id for s in batch]

    assert service.admit(str(job.id)) is True

    assert specs[0].first_seq == 1 and not redis_client.exists(job_stream_key(str(job.id)))
