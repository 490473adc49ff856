"""Deleting a job deletes it from its webhook deliveries too (issue 45): after DELETE
/api/v1/jobs/<id> the stored bodies hold nothing of the job, a retry that was pending sends
nothing, and an attempt under way when the delete came has ended by the time the DELETE returns.
The Celery tasks run in this process against the real database, Redis and a receiver on loopback."""

from __future__ import annotations

import ipaddress
import threading

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from api.models import Job, JobStatus
from api.webhooks.models import WebhookDelivery, WebhookDeliveryStatus
from api.webhooks.services import DELIVER_WEBHOOK_TASK
from api.webhooks.tasks import deliver_webhook, send_due_webhooks
from api.worker.sink import RedisJobSink
from engine_worker.protocol import FinalResult, StepBatch
from tests.api.factories import make_api_key, make_job
from tests.api.webhooks.receiver import WebhookReceiver

pytestmark = pytest.mark.django_db(transaction=True)
WORKER = "w-hooks-delete"
# The job's output, metadata and stop string: what its body carries (the prompt is never in it).
PRIVATE = ("my private answer", "my private tag", "my private stop")
PARAMS = {"max_tokens": 16, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
          "seed": None, "stop": [PRIVATE[2]]}


@pytest.fixture(autouse=True)
def loopback_allowed(settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = (ipaddress.ip_network("127.0.0.0/8"),)


def _ended_job(redis_client, url: str):
    api_key, secret = make_api_key()
    job = make_job(api_key=api_key, status=JobStatus.IN_PROGRESS, worker_id=WORKER, webhook_url=url,
                   prompt="my private prompt", metadata={"tag": PRIVATE[1]}, params=PARAMS)
    RedisJobSink(worker_id=WORKER, redis_client=redis_client).publish(StepBatch(finals=(FinalResult(
        job_id=str(job.id), text=PRIVATE[0], finish_reason="stop", prompt_tokens=3, completion_tokens=2,
        last_seq=2),)))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return job, client


def _sent(broker) -> list:
    send_due_webhooks()
    sent = [args for name, args, _ in broker.messages if name == DELIVER_WEBHOOK_TASK]
    broker.messages.clear()
    return sent


def test_a_delete_clears_the_stored_body_and_a_pending_retry_sends_nothing(broker, redis_client):
    with WebhookReceiver([500]) as receiver:
        job, client = _ended_job(redis_client, receiver.url)
        assert [deliver_webhook(*args) for args in _sent(broker)] == [WebhookDeliveryStatus.PENDING]
        body = WebhookDelivery.objects.get().payload
        assert all(text in body for text in PRIVATE), body  # the retry's body

        assert client.delete(f"/api/v1/jobs/{job.id}").status_code == 200

        delivery = WebhookDelivery.objects.get()
        stored = " ".join(str(value) for value in WebhookDelivery.objects.values().get().values())
        assert not any(text in stored for text in (*PRIVATE, "my private prompt")), stored
        assert delivery.status == WebhookDeliveryStatus.FAILED and "deleted" in delivery.last_error
        # The retry's time comes: nothing is sent, whatever message was already on its way.
        WebhookDelivery.objects.update(next_attempt_at=timezone.now())
        [deliver_webhook(*args) for args in [*_sent(broker), [str(delivery.id), 1]]]
        assert len(receiver.received) == 1
    assert Job.objects.get(id=job.id).deleted_at is not None


def test_a_delete_returns_after_the_attempt_under_way_has_ended(broker, redis_client):
    with WebhookReceiver(delay_s=1.5) as receiver:
        job, client = _ended_job(redis_client, receiver.url)
        [args] = _sent(broker)
        attempt = threading.Thread(target=deliver_webhook, args=args)
        attempt.start()
        receiver.wait_for(1, 30)  # its request has reached the receiver, which answers 1.5 s later

        assert client.delete(f"/api/v1/jobs/{job.id}").status_code == 200

        ended = not attempt.is_alive()
        attempt.join(30)
    assert ended, "the DELETE returned while an attempt with the job's content was still sending"
    assert not any(text in WebhookDelivery.objects.get().payload for text in PRIVATE)
