"""Delivery of a job's webhook to a real HTTP receiver on loopback, with the Celery tasks run in
this process against the real database: signed as the Standard Webhooks spec says, retried with
backoff, logged attempt by attempt, never sent twice for one attempt, never through a redirect,
never to an address that became private, and not at all for a revoked key."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import random
import socket
import threading

import pytest
from django.utils import timezone
from rest_framework.test import APIClient
from standardwebhooks.webhooks import Webhook

from api.jobs.services.cancel import job_cancel
from api.keys.services import api_key_revoke
from api.models import JobStatus
from api.webhooks.delivery import RETRY_MAX_DELAY_S, webhook_retry_delay
from api.webhooks.models import WebhookDelivery, WebhookDeliveryStatus
from api.webhooks.services import DELIVER_WEBHOOK_TASK, webhook_enqueue
from api.webhooks.tasks import deliver_webhook, send_due_webhooks
from api.worker.sink import RedisJobSink
from engine_worker.protocol import FinalResult, StepBatch
from tests.api.factories import make_api_key, make_job
from tests.api.webhooks.receiver import WebhookReceiver
from tests.integration.procs import free_port

pytestmark = pytest.mark.django_db(transaction=True)  # deliveries are sent on commit
WORKER = "w-hooks"


@pytest.fixture(autouse=True)
def loopback_allowed(settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = (ipaddress.ip_network("127.0.0.0/8"),)


@pytest.fixture
def receiver():
    with WebhookReceiver() as running:
        yield running


def _finish(job, *, finish_reason: str = "stop", text: str = "The end.") -> None:
    """The job's final, through the engine worker's own sink."""
    sink = RedisJobSink(worker_id=WORKER, redis_client=_redis())
    sink.publish(StepBatch(finals=(FinalResult(job_id=str(job.id), text=text, finish_reason=finish_reason,
                                               prompt_tokens=3, completion_tokens=2, last_seq=2),)))


def _redis():
    from api.common.redis_client import get_redis

    return get_redis()


def _running_job(api_key, url: str):
    return make_job(api_key=api_key, status=JobStatus.IN_PROGRESS, worker_id=WORKER, webhook_url=url)


def _run_sent(broker) -> list:
    """What beat and the light worker do next: send the due deliveries (the engine worker's are due
    at once), then run every deliver_webhook message sent so far; returns their results."""
    send_due_webhooks()
    sent = [args for name, args, _ in broker.messages if name == DELIVER_WEBHOOK_TASK]
    broker.messages.clear()
    return [deliver_webhook(*args) for args in sent]


def test_a_finished_job_is_posted_once_signed_with_its_keys_secret_and_carrying_the_job(receiver, broker,
                                                                                       redis_client):
    api_key, secret = make_api_key()
    job = _running_job(api_key, receiver.url)

    _finish(job)
    assert _run_sent(broker) == [WebhookDeliveryStatus.DELIVERED]

    [hook] = receiver.received
    api_key.refresh_from_db()
    payload = Webhook(api_key.webhook_secret).verify(hook.body, hook.headers)
    assert hook.path == "/hooks" and hook.headers["content-type"] == "application/json"
    assert payload["type"] == "job.completed"
    assert dt.datetime.fromisoformat(payload["timestamp"]) <= timezone.now()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    shown = client.get(f"/api/v1/jobs/{job.id}").json()
    shown["timings"]["tokens_per_second"] = payload["data"]["timings"]["tokens_per_second"]  # read at another time
    assert payload["data"] == shown
    assert payload["data"]["output_text"] == "The end." and payload["data"]["webhook_url"] == receiver.url
    delivery = WebhookDelivery.objects.get()
    assert hook.headers["webhook-id"] == delivery.event_id
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("delivered", 1, 200)
    [attempt] = delivery.attempt_log.all()
    assert (attempt.number, attempt.status_code, attempt.error) == (1, 200, "")
    assert attempt.duration_ms > 0 and attempt.response_excerpt == "ok"


def test_a_500_is_retried_with_growing_delays_until_a_2xx_and_every_attempt_is_logged(broker, redis_client):
    api_key, _ = make_api_key()
    with WebhookReceiver([500, 503]) as receiver:
        job = _running_job(api_key, receiver.url)
        _finish(job, finish_reason="error")
        delays = []
        for _ in range(3):
            before = timezone.now()
            results = _run_sent(broker)
            delivery = WebhookDelivery.objects.get()
            if delivery.status == WebhookDeliveryStatus.PENDING:
                delays.append((delivery.next_attempt_at - before).total_seconds())
                # Its time comes: the sweep sends it (nothing is sent before).
                assert send_due_webhooks() == 0
                WebhookDelivery.objects.update(next_attempt_at=timezone.now())
                assert send_due_webhooks() == 1
        received = receiver.received

    assert results == [WebhookDeliveryStatus.DELIVERED]
    assert [(a.number, a.status_code) for a in delivery.attempt_log.all()] == [(1, 500), (2, 503), (3, 200)]
    assert 5 <= delays[0] <= 10.5 and 10 <= delays[1] <= 20.5  # 10 s then 20 s, each with up to half off
    assert len({r.headers["webhook-id"] for r in received}) == 1  # one message, three attempts
    assert len({r.body for r in received}) == 1
    assert json.loads(received[0].body)["type"] == "job.failed"


def test_retry_delays_double_from_10_s_to_2_h_with_half_of_each_random():
    rng = random.Random(7)
    for attempt in range(1, 25):
        ceiling = min(RETRY_MAX_DELAY_S, 10.0 * 2 ** (attempt - 1))
        delays = [webhook_retry_delay(attempt, rng=rng) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1


def test_a_delivery_is_given_up_once_its_next_try_would_fall_past_its_window(receiver, broker, redis_client, settings):
    settings.WEBHOOK_RETRY_WINDOW_S = 0
    receiver.statuses = [500]
    _finish(_running_job(make_api_key()[0], receiver.url))

    assert _run_sent(broker) == [WebhookDeliveryStatus.FAILED]
    assert send_due_webhooks() == 0


def test_410_gone_stops_the_retries(receiver, broker, redis_client):
    receiver.statuses = [410]
    _finish(_running_job(make_api_key()[0], receiver.url))

    assert _run_sent(broker) == [WebhookDeliveryStatus.FAILED]
    assert WebhookDelivery.objects.get().last_status_code == 410


def test_a_refused_connection_is_logged_as_an_error_and_retried(broker, redis_client):
    _finish(_running_job(make_api_key()[0], f"http://127.0.0.1:{free_port()}/nobody"))

    assert _run_sent(broker) == [WebhookDeliveryStatus.PENDING]
    [attempt] = WebhookDelivery.objects.get().attempt_log.all()
    assert attempt.status_code is None and "ConnectError" in attempt.error


def test_a_slow_receiver_times_out_and_is_retried(broker, redis_client, settings):
    settings.WEBHOOK_TIMEOUT_S = 0.3
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        _finish(_running_job(make_api_key()[0], f"http://127.0.0.1:{silent.getsockname()[1]}/slow"))
        assert _run_sent(broker) == [WebhookDeliveryStatus.PENDING]

    [attempt] = WebhookDelivery.objects.get().attempt_log.all()
    assert "Timeout" in attempt.error and attempt.duration_ms < 3000


def test_a_receiver_that_answers_a_byte_at_a_time_is_cut_off_at_the_attempts_deadline(broker, redis_client,
                                                                                       settings):
    settings.WEBHOOK_TIMEOUT_S = 0.5
    with socket.socket() as tarpit:
        tarpit.bind(("127.0.0.1", 0))
        tarpit.listen(1)
        stop = threading.Event()

        def drip() -> None:
            conn, _ = tarpit.accept()
            with conn:
                for byte in b"HTTP/1.1 200 OK\r\nx-slow: " + b"a" * 1000:
                    if stop.wait(0.05):
                        return
                    conn.send(bytes([byte]))

        thread = threading.Thread(target=drip, daemon=True)
        thread.start()
        _finish(_running_job(make_api_key()[0], f"http://127.0.0.1:{tarpit.getsockname()[1]}/slow"))
        assert _run_sent(broker) == [WebhookDeliveryStatus.PENDING]
        stop.set()
        thread.join(5)

    [attempt] = WebhookDelivery.objects.get().attempt_log.all()
    assert attempt.error.startswith("Timeout") and attempt.duration_ms < 2000


def test_a_redirect_is_never_followed(broker, redis_client):
    with WebhookReceiver() as elsewhere, WebhookReceiver([302], location=elsewhere.url) as receiver:
        _finish(_running_job(make_api_key()[0], receiver.url))
        assert _run_sent(broker) == [WebhookDeliveryStatus.PENDING]
        assert len(receiver.received) == 1 and elsewhere.received == []
    assert WebhookDelivery.objects.get().last_status_code == 302


def test_a_name_that_resolves_to_a_private_address_at_delivery_is_not_called(receiver, broker, redis_client,
                                                                             settings, monkeypatch):
    """DNS rebinding: the name was public when the job was accepted, and points at loopback now."""
    settings.WEBHOOK_ALLOWED_NETWORKS = ()
    port = receiver.server.server_address[1]
    _finish(_running_job(make_api_key()[0], f"http://hooks.example.com:{port}/hooks"))
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, p, *a, **k: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", p))])

    assert _run_sent(broker) == [WebhookDeliveryStatus.PENDING]
    assert receiver.received == []
    assert "127.0.0.1" in WebhookDelivery.objects.get().last_error


def test_a_pinned_name_is_called_at_the_checked_address_with_its_own_host_header(receiver, broker, redis_client,
                                                                                 monkeypatch):
    port = receiver.server.server_address[1]
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, p, *a, **k: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", p))])
    _finish(_running_job(make_api_key()[0], f"http://hooks.example.com:{port}/hooks?k=v"))

    assert _run_sent(broker) == [WebhookDeliveryStatus.DELIVERED]
    assert receiver.received[0].headers["host"] == f"hooks.example.com:{port}"
    assert receiver.received[0].path == "/hooks?k=v"


def test_a_final_sends_no_message_from_the_engine_worker_and_the_sweep_sends_it_at_once(receiver, broker,
                                                                                        redis_client):
    _finish(_running_job(make_api_key()[0], receiver.url))

    assert broker.messages == []
    assert send_due_webhooks() == 1
    assert send_due_webhooks() == 0  # its message is on its way: not sent twice


def test_two_messages_for_one_attempt_make_one_request(receiver, broker, redis_client):
    _finish(_running_job(make_api_key()[0], receiver.url))
    send_due_webhooks()
    [(name, args, _)] = broker.messages

    assert deliver_webhook(*args) == WebhookDeliveryStatus.DELIVERED
    assert deliver_webhook(*args) is None
    assert len(receiver.received) == 1


def test_a_lost_message_is_sent_again_by_the_sweep_once_its_time_has_passed(receiver, broker, redis_client):
    job = make_job(api_key=make_api_key()[0], webhook_url=receiver.url)
    broker.down = ConnectionError("broker unreachable")
    job_cancel(job_id=job.id)  # a web-side end: its message is sent on commit, and is lost
    broker.down = None
    delivery = WebhookDelivery.objects.get()
    assert delivery.status == WebhookDeliveryStatus.PENDING and broker.messages == []

    assert send_due_webhooks() == 0  # not yet: a message may still be on its way
    WebhookDelivery.objects.update(next_attempt_at=timezone.now() - dt.timedelta(seconds=1))
    assert send_due_webhooks() == 1
    assert _run_sent(broker) == [WebhookDeliveryStatus.DELIVERED]
    assert len(receiver.received) == 1


def test_a_revoked_keys_job_is_not_delivered(receiver, broker, redis_client):
    api_key, _ = make_api_key()
    _finish(_running_job(api_key, receiver.url))
    api_key_revoke(api_key_id=api_key.id)

    assert _run_sent(broker) == [WebhookDeliveryStatus.FAILED]
    assert receiver.received == []
    delivery = WebhookDelivery.objects.get()
    assert "revoked" in delivery.last_error
    assert delivery.attempt_log.get().error == delivery.last_error


def test_a_rotated_secret_signs_the_next_attempts(receiver, broker, redis_client):
    api_key, secret = make_api_key()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    _finish(_running_job(api_key, receiver.url))

    rotated = client.post(f"/api/v1/keys/{api_key.id}/webhook_secret")
    _run_sent(broker)

    assert rotated.status_code == 200
    body = rotated.json()
    assert body["object"] == "webhook_secret" and body["api_key_id"] == api_key.id
    assert body["secret"].startswith("whsec_")
    assert Webhook(body["secret"]).verify(receiver.received[0].body, receiver.received[0].headers)
    assert client.post(f"/api/v1/keys/{make_api_key()[0].id}/webhook_secret").status_code == 404


def test_the_generic_service_records_an_event_once_and_sends_its_data(receiver, broker, redis_client):
    api_key, _ = make_api_key()

    first = webhook_enqueue(api_key=api_key, url=receiver.url, event_type="batch.completed", event_id="batch_1",
                            data={"id": "batch_1", "object": "batch"})
    again = webhook_enqueue(api_key=api_key, url=receiver.url, event_type="batch.completed", event_id="batch_1",
                            data={"id": "batch_1", "object": "batch"})
    results = _run_sent(broker)

    assert first is not None and again is None
    assert results == [WebhookDeliveryStatus.DELIVERED]
    api_key.refresh_from_db()
    payload = Webhook(api_key.webhook_secret).verify(receiver.received[0].body, receiver.received[0].headers)
    assert payload["type"] == "batch.completed" and payload["data"] == {"id": "batch_1", "object": "batch"}
    assert receiver.received[0].headers["webhook-id"] == "batch_1"


def test_the_generic_service_without_send_leaves_the_event_to_the_sweep(receiver, broker, redis_client):
    api_key, _ = make_api_key()

    delivery = webhook_enqueue(api_key=api_key, url=receiver.url, event_type="batch.failed", event_id="batch_2",
                               data={"id": "batch_2"}, send=False)

    assert broker.messages == []
    assert _run_sent(broker) == [WebhookDeliveryStatus.DELIVERED]
    assert receiver.received[0].headers["webhook-id"] == delivery.event_id == "batch_2"
