"""The admin shows a key's webhook secret once (when the key is made or its secret rotated), and
each webhook delivery with its attempts; a delivered or failed delivery can be sent again."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from api.models import ApiKey, JobStatus
from api.webhooks.models import WebhookAttempt, WebhookDelivery, WebhookDeliveryStatus
from api.webhooks.services import DELIVER_WEBHOOK_TASK
from tests.api.factories import make_api_key, make_job, make_user

pytestmark = pytest.mark.django_db(transaction=True)  # the redelivery's message is sent on commit


@pytest.fixture
def staff():
    client = Client()
    client.force_login(make_user(is_staff=True, is_superuser=True))
    return client


def _messages(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def test_adding_a_key_shows_its_webhook_secret_once(staff):
    owner = make_user()
    response = staff.post("/admin/api/apikey/add/", {
        "owner": owner.id, "name": "ops", "requests_per_minute": 60, "tokens_per_day": 1000,
        "max_concurrent_jobs": 2, "max_tokens_per_job": 100, "priority": 3,
    }, follow=True)

    secret = next(m for m in _messages(response) if "whsec_" in m).rsplit(" ", 1)[-1]
    api_key = ApiKey.objects.get(owner=owner)
    assert secret == api_key.webhook_secret
    assert secret not in staff.get(f"/admin/api/apikey/{api_key.id}/change/").content.decode()


def test_the_rotate_action_gives_each_selected_key_a_new_secret_shown_once(staff):
    keys = [make_api_key()[0] for _ in range(2)]
    before = {key.id: key.webhook_secret for key in keys}

    response = staff.post("/admin/api/apikey/", {"action": "rotate_webhook_secrets",
                                                 "_selected_action": [key.id for key in keys]}, follow=True)

    shown = [m.rsplit(" ", 1)[-1] for m in _messages(response) if "whsec_" in m]
    after = {key.id: ApiKey.objects.get(id=key.id).webhook_secret for key in keys}
    assert sorted(shown) == sorted(after.values())
    assert all(after[key_id] != secret for key_id, secret in before.items())


def test_a_delivery_page_shows_its_attempts(staff):
    api_key, _ = make_api_key()
    job = make_job(api_key=api_key, status=JobStatus.COMPLETED)
    delivery = WebhookDelivery.objects.create(event_id="job_x_1", event_type="job.completed", url="http://h/x",
                                              api_key=api_key, job=job, attempts=2, last_status_code=500)
    for number, code in ((1, 503), (2, 500)):
        WebhookAttempt.objects.create(delivery=delivery, number=number, started_at=timezone.now(), duration_ms=12.5,
                                      status_code=code, error="", response_excerpt=f"down {number}")

    listing = staff.get("/admin/api/webhookdelivery/")
    page = staff.get(f"/admin/api/webhookdelivery/{delivery.id}/change/")

    assert listing.status_code == 200 and b"job_x_1" in listing.content
    assert page.status_code == 200
    assert b"down 1" in page.content and b"down 2" in page.content and b"503" in page.content
    assert staff.get(f"/admin/api/job/{job.id}/change/").status_code == 200


def test_redeliver_sends_failed_deliveries_again_and_leaves_pending_ones_to_their_retries(staff, broker):
    api_key, _ = make_api_key()
    failed = WebhookDelivery.objects.create(event_id="e1", event_type="job.failed", url="http://h/x", api_key=api_key,
                                            status=WebhookDeliveryStatus.FAILED, attempts=20)
    pending = WebhookDelivery.objects.create(event_id="e2", event_type="job.failed", url="http://h/x",
                                             api_key=api_key, attempts=1)

    response = staff.post("/admin/api/webhookdelivery/", {"action": "redeliver",
                                                          "_selected_action": [failed.id, pending.id]}, follow=True)

    failed.refresh_from_db()
    assert failed.status == WebhookDeliveryStatus.PENDING and failed.retry_until > timezone.now()
    assert [(name, args) for name, args, _ in broker.messages] == [(DELIVER_WEBHOOK_TASK, [str(failed.id), 20])]
    assert any("1 still pending" in m for m in _messages(response))


def test_create_api_user_prints_the_new_keys_webhook_secret_before_the_key():
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("create_api_user", "hooks", stdout=out)

    lines = out.getvalue().strip().splitlines()
    api_key = ApiKey.objects.get(owner__username="hooks")
    assert lines[0].endswith(api_key.webhook_secret) and api_key.webhook_secret.startswith("whsec_")
    assert lines[-1].startswith("sk-")
