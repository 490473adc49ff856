"""Dispatch counts a send in the job's row before the message goes out, and takes it back when
the send fails."""

from __future__ import annotations

import pytest

from api.jobs.services import dispatch
from api.models import Job
from tests.api.factories import make_job

pytestmark = pytest.mark.django_db


def test_the_send_is_counted_before_the_message_goes_out(monkeypatch):
    job = make_job(model="tiny", dispatch_count=0)
    counted_at_send = []

    def send(*, job_id: str, queue: str | None = None) -> None:
        # What a worker claiming the job the moment the message lands finds: the count written
        # (no UPDATE of the row left to hold its lock against the claim's SKIP LOCKED).
        counted_at_send.append(Job.objects.get(id=job_id).dispatch_count)

    monkeypatch.setattr(dispatch, "job_dispatch", send)

    assert dispatch.job_dispatch_counted(job_id=str(job.id))
    assert counted_at_send == [1]
    assert Job.objects.get(id=job.id).dispatch_count == 1


@pytest.mark.parametrize("precounted", [False, True])
def test_a_failed_send_takes_its_count_back(monkeypatch, precounted):
    job = make_job(model="tiny", dispatch_count=1 if precounted else 0)

    def send(*, job_id: str, queue: str | None = None) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr(dispatch, "job_dispatch", send)

    assert not dispatch.job_dispatch_counted(job_id=str(job.id), precounted=precounted)
    assert Job.objects.get(id=job.id).dispatch_count == 0
