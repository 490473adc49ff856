"""A job submitted through REST to the real stack (daphne, an engine worker, celery beat, the
light Celery worker and the webhooks worker, Redis, Postgres) calls its webhook on a receiver on loopback: signed with the
key's secret, carrying the job as GET shows it, and retried by the webhooks worker after a 500."""

from __future__ import annotations

import asyncio
import json

import pytest
from standardwebhooks.webhooks import Webhook

from api.models import ApiKey
from api.webhooks.models import WebhookDelivery, WebhookDeliveryStatus
from tests.api.factories import make_api_key
from tests.api.webhooks.receiver import WebhookReceiver
from tests.integration.client import ServiceClient
from tests.integration.procs import wait_for, webhook_stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def hooks_stack(workers, service_env, tmp_path):
    """daphne, one engine worker, celery beat and the light Celery worker, with loopback webhooks
    allowed."""
    env = {**service_env, "WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8"}
    workers.env = env
    workers.start("w-hooks")
    with webhook_stack(env, tmp_path) as port:
        yield port


def test_a_rest_job_calls_its_webhook_signed_and_the_light_worker_retries_a_500(hooks_stack):
    api_key, secret = make_api_key()
    client = ServiceClient(hooks_stack, secret)
    with WebhookReceiver([500]) as receiver:
        job_id = asyncio.run(client.submit({"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0.0,
                                            "webhook_url": receiver.url}))
        # The first attempt as soon as beat's sweep finds the job's end; the retry 5 to 10 s later.
        received = receiver.wait_for(2, 240)
        assert len(received) == 2, f"{len(received)} webhook requests arrived"

    secret_now = ApiKey.objects.get(id=api_key.id).webhook_secret
    payloads = [Webhook(secret_now).verify(hook.body, hook.headers) for hook in received]
    job = asyncio.run(client.get(job_id))
    assert job["status"] == "completed" and job["webhook_url"] == receiver.url
    assert payloads[0] == payloads[1] and payloads[0]["type"] == "job.completed"
    assert payloads[0]["data"]["id"] == job_id
    assert payloads[0]["data"]["output_text"] == job["output_text"] != ""
    assert payloads[0]["data"]["usage"] == job["usage"]
    assert received[0].headers["webhook-id"] == received[1].headers["webhook-id"]
    delivery = wait_for(lambda: WebhookDelivery.objects.filter(status=WebhookDeliveryStatus.DELIVERED).first(),
                        30, "the delivery to be recorded")
    assert [(a.number, a.status_code) for a in delivery.attempt_log.all()] == [(1, 500), (2, 200)]
    assert json.loads(received[1].body)["data"]["status"] == "completed"
