"""``run_jobs``: the worker side of a message that carries several job ids."""

from __future__ import annotations

from api import tasks
from api.streaming import worker


class AdmittingService:
    def __init__(self, refuse: set[str] = frozenset()) -> None:
        self.admitted: list[str] = []
        self.refuse = refuse

    def admit(self, job_id: str) -> bool:
        if job_id in self.refuse:
            return False
        self.admitted.append(job_id)
        return True


def test_every_id_of_the_message_is_admitted_in_order():
    service = AdmittingService(refuse={"b"})
    worker.install(service)
    try:
        assert tasks.run_jobs(["a", "b", "c"]) == 2
    finally:
        worker.install(None)
    assert service.admitted == ["a", "c"]


def test_a_process_without_an_engine_leaves_the_jobs_queued(caplog):
    worker.install(None)
    assert tasks.run_jobs(["a", "b"]) == 0
    assert "without an engine" in caplog.text
