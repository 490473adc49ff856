"""``run_job``: the engine worker's side of a job's message."""

from __future__ import annotations

from api.jobs import tasks
from api.worker import service as worker


class AdmittingService:
    def __init__(self, refuse: set[str] = frozenset()) -> None:
        self.admitted: list[str] = []
        self.refuse = refuse

    def admit(self, job_id: str) -> bool:
        if job_id in self.refuse:
            return False
        self.admitted.append(job_id)
        return True


def test_the_job_of_a_message_is_admitted_by_this_processs_worker():
    service = AdmittingService(refuse={"b"})
    worker.install(service)
    try:
        assert [tasks.run_job(job_id) for job_id in ("a", "b", "c")] == [True, False, True]
    finally:
        worker.install(None)
    assert service.admitted == ["a", "c"]


def test_a_process_without_an_engine_leaves_the_job_queued(caplog):
    worker.install(None)
    assert tasks.run_job("a") is False
    assert "without an engine" in caplog.text
