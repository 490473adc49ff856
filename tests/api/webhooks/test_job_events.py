"""Every way a job ends records one webhook delivery, in the transaction of its status change, and
sends its message on commit; the same end recorded twice is still one delivery."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.db import transaction
from django.utils import timezone

from api.jobs.services import lifecycle as job_lifecycle
from api.jobs.services import outputs as job_outputs
from api.jobs.services.cancel import job_cancel
from api.jobs.services.requeue import job_requeue
from api.models import JobStatus
from api.webhooks.job_events import job_webhooks_enqueue
from api.webhooks.models import WebhookDelivery
from api.webhooks.services import DELIVER_WEBHOOK_TASK
from engine_worker.protocol import FinalResult
from tests.api.factories import make_api_key, make_job

pytestmark = pytest.mark.django_db(transaction=True)

URL = "http://93.184.216.34/hooks"
WORKER = "w-1"


def _final(job, finish_reason: str = "stop") -> FinalResult:
    return FinalResult(job_id=str(job.id), text="x", finish_reason=finish_reason, prompt_tokens=3,
                       completion_tokens=1, finished_at=time.time(), last_seq=1)


def _running(**fields):
    return make_job(api_key=make_api_key()[0], status=JobStatus.IN_PROGRESS, worker_id=WORKER, webhook_url=URL,
                    **fields)


def _sent(broker) -> list[str]:
    return [args[0] for name, args, _ in broker.messages if name == DELIVER_WEBHOOK_TASK]


@pytest.mark.parametrize(("finish_reason", "event"), [("stop", "job.completed"), ("length", "job.completed"),
                                                       ("error", "job.failed"), ("abort", "job.cancelled")])
def test_a_final_from_the_engine_records_its_event(broker, finish_reason, event):
    job = _running()

    assert job_outputs.jobs_complete(results=[_final(job, finish_reason)], worker_id=WORKER) == [str(job.id)]

    delivery = WebhookDelivery.objects.get()
    assert (delivery.event_type, delivery.url, delivery.job_id, delivery.api_key_id) == (
        event, URL, job.id, job.api_key_id)
    assert _sent(broker) == []  # the engine worker's I/O thread never waits on the broker
    assert delivery.next_attempt_at <= timezone.now()  # due: the next sweep sends it


def test_finals_of_jobs_without_a_webhook_record_nothing(broker):
    plain = make_job(status=JobStatus.IN_PROGRESS, worker_id=WORKER)
    hooked = _running()

    written = job_outputs.jobs_complete(results=[_final(plain), _final(hooked)], worker_id=WORKER)

    assert sorted(written) == sorted([str(plain.id), str(hooked.id)])
    assert list(WebhookDelivery.objects.values_list("job_id", flat=True)) == [hooked.id]


def test_a_failure_recorded_by_the_worker_records_job_failed(broker):
    job = _running()

    assert job_outputs.job_fail(job_id=str(job.id), worker_id=WORKER, error="boom")

    assert WebhookDelivery.objects.get().event_type == "job.failed"


def test_cancel_of_a_queued_job_records_job_cancelled(broker):
    job = make_job(api_key=make_api_key()[0], webhook_url=URL)

    job_cancel(job_id=job.id)
    job_cancel(job_id=job.id)  # a second cancel changes nothing

    delivery = WebhookDelivery.objects.get()
    assert delivery.event_type == "job.cancelled"
    assert _sent(broker) == [str(delivery.id)]  # sent on commit


def test_cancel_of_a_running_job_records_nothing_until_its_final(broker):
    job = _running()

    job_cancel(job_id=job.id)
    assert not WebhookDelivery.objects.exists()
    job_outputs.jobs_complete(results=[_final(job, "abort")], worker_id=WORKER)

    assert WebhookDelivery.objects.get().event_type == "job.cancelled"


def test_expiry_records_job_expired_for_each_expired_job(broker):
    old = timezone.now() - dt.timedelta(hours=2)
    key = make_api_key()[0]
    jobs = [make_job(api_key=key, webhook_url=URL, queued_at=old) for _ in range(3)]
    fresh = make_job(api_key=key, webhook_url=URL)

    assert job_lifecycle.jobs_expire_queued(older_than_s=3600, batch=2) == 3

    assert sorted(WebhookDelivery.objects.values_list("job_id", flat=True)) == sorted(j.id for j in jobs)
    assert set(WebhookDelivery.objects.values_list("event_type", flat=True)) == {"job.expired"}
    fresh.refresh_from_db()
    assert fresh.status == JobStatus.QUEUED


def test_a_dead_workers_cancelled_job_and_its_late_final_make_one_delivery(broker):
    job = _running(cancel_requested=True, lease_expires_at=timezone.now() - dt.timedelta(seconds=1))

    assert job_lifecycle.job_hand_back(job_id=str(job.id), worker_id=None, redispatch_after_s=0) == JobStatus.CANCELLED
    # The worker was not dead after all: its abort final still lands on the cancelled row.
    assert job_outputs.jobs_complete(results=[_final(job, "abort")], worker_id=WORKER) == [str(job.id)]
    job_webhooks_enqueue(job_ids=[job.id])  # and any other path that records the same end

    assert WebhookDelivery.objects.get().event_type == "job.cancelled"


def test_a_job_requeued_by_an_operator_announces_its_next_end_too(broker):
    job = _running()
    job_outputs.job_fail(job_id=str(job.id), worker_id=WORKER, error="boom")

    job_requeue(job_id=job.id)
    job.refresh_from_db()
    job_cancel(job_id=job.id)

    assert sorted(WebhookDelivery.objects.values_list("event_type", flat=True)) == ["job.cancelled", "job.failed"]


def test_nothing_is_recorded_or_sent_when_the_transaction_rolls_back(broker):
    job = _running()

    with pytest.raises(RuntimeError), transaction.atomic():
        job_outputs.job_fail(job_id=str(job.id), worker_id=WORKER, error="boom")
        raise RuntimeError("rolled back")

    assert not WebhookDelivery.objects.exists()
    assert _sent(broker) == []


def test_the_hourly_purge_deletes_ended_deliveries_as_old_as_purged_jobs_and_keeps_pending_ones(settings):
    from api.jobs.tasks import purge_jobs
    from api.webhooks.models import WebhookDeliveryStatus

    settings.JOB_RETENTION_DAYS = 2
    old = timezone.now() - dt.timedelta(days=3)
    for status in WebhookDeliveryStatus.values:
        WebhookDelivery.objects.create(event_id=f"old-{status}", event_type="job.completed", url=URL, status=status,
                                       created_at=old)
    WebhookDelivery.objects.create(event_id="new", event_type="job.completed", url=URL,
                                   status=WebhookDeliveryStatus.DELIVERED)

    purge_jobs()

    assert sorted(WebhookDelivery.objects.values_list("event_id", flat=True)) == ["new", "old-pending"]
