"""Webhooks: record a delivery in the caller's transaction, wake the webhooks worker on commit, and
send again what nothing came of.

Whatever calls a URL on an event (a job's end, api/webhooks/job_events.py; a batch's) calls
:func:`webhook_enqueue` in the transaction that records the event, so the event and its delivery
commit together or not at all. The ``event_id`` is unique: recording the same event twice (a
retried write, two paths racing to end one job) leaves one delivery.

Each attempt is one Celery message ``deliver_webhook(id, attempt)`` on the ``webhooks`` queue,
which the webhooks worker consumes (inference_service/celery.py; never the engine workers' or the
light worker's). The message names the attempt it is for, and the
attempt claims the delivery with a conditional UPDATE, so a duplicate message does nothing.

Who sends the first message: the web tier's events send it once their transaction commits
(``send=True``, the default). Deliveries recorded by the engine worker (a job's final, written by
its I/O thread) and by the reconciler are left due instead (``send=False``), and
``send_due_webhooks`` (celery beat, every 2 s) sends them: the I/O thread writes every running
job's output, and a publish to a broker that is down blocks for seconds (kombu's connection
attempts; 6 s measured against a refused port). The same sweep sends the retries when their time
comes (api/webhooks/delivery.py) and any message that was lost (Redis down or flushed, a
worker killed mid-attempt: the delivery stays pending, with a ``next_attempt_at`` that passes). No
retry waits in the broker as a delayed message: with Redis, one delayed past its visibility
timeout would be delivered twice.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from functools import partial
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction
from django.utils import timezone

from api.models import ApiKey
from api.webhooks.models import WebhookDelivery, WebhookDeliveryStatus
from inference_service.celery import app as celery_app

logger = logging.getLogger(__name__)

DELIVER_WEBHOOK_TASK = "api.tasks.deliver_webhook"


def redispatch_after() -> dt.timedelta:
    """How long a sent message or a claimed attempt has before the delivery is sent again: well
    past an attempt's longest (WEBHOOK_TIMEOUT_S, and the host's lookup)."""
    return dt.timedelta(seconds=max(60.0, 4 * float(settings.WEBHOOK_TIMEOUT_S)))


def retry_window() -> dt.timedelta:
    return dt.timedelta(seconds=int(settings.WEBHOOK_RETRY_WINDOW_S))


def webhook_body(*, event_type: str, at: dt.datetime, data: dict[str, Any]) -> str:
    """The body of an event, as the Standard Webhooks spec shapes it: ``type``, ``timestamp`` (when
    the event happened, ISO 8601 in UTC) and ``data``. ASCII only, so its bytes are unambiguous."""
    stamp = at.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    return json.dumps({"type": event_type, "timestamp": stamp, "data": data}, cls=DjangoJSONEncoder,
                      separators=(",", ":"))


def webhook_enqueue(*, api_key: ApiKey, url: str, event_type: str, event_id: str, data: dict[str, Any],
                    send: bool = True) -> WebhookDelivery | None:
    """Record the delivery of event ``event_id`` (``event_type``, e.g. ``batch.completed``, with
    ``data``) to ``url``, signed with ``api_key``'s webhook secret, and send it once the caller's
    transaction commits. Returns None when ``event_id`` was recorded before (nothing is added).

    ``url`` must have passed :func:`api.webhooks.targets.webhook_url_check` when the client named it;
    each attempt checks its address again. ``event_id`` (at most 128 characters, sent as
    ``webhook-id``) must name this event alone: the same id is the same event. ``send=False``
    (from the engine worker's threads): no message on commit; the next ``send_due_webhooks`` sends
    it."""
    now = timezone.now()
    delivery = WebhookDelivery(event_id=event_id, event_type=event_type, url=url, api_key=api_key,
                               payload=webhook_body(event_type=event_type, at=now, data=data),
                               created_at=now, next_attempt_at=now + redispatch_after() if send else now,
                               retry_until=now + retry_window())
    try:
        with transaction.atomic():
            delivery.save(force_insert=True)
    except IntegrityError:
        if not WebhookDelivery.objects.filter(event_id=event_id).exists():
            raise
        return None
    if send:
        transaction.on_commit(partial(webhook_send, delivery_id=str(delivery.id), attempt=0))
    return delivery


def webhooks_enqueue(*, deliveries: list[WebhookDelivery], send: bool = True) -> None:
    """:func:`webhook_enqueue` for unsaved rows built by the caller, in one INSERT; rows whose
    ``event_id`` is already recorded are left out. ``send=False``: no message on commit; the rows
    are due at once, and the next ``send_due_webhooks`` sends them."""
    if not deliveries:
        return
    now = timezone.now()
    for delivery in deliveries:
        delivery.created_at = now
        delivery.next_attempt_at = now + redispatch_after() if send else now
        delivery.retry_until = now + retry_window()
    WebhookDelivery.objects.bulk_create(deliveries, ignore_conflicts=True)
    if send:
        # A row left out keeps its unsaved id: its message finds no delivery and does nothing.
        for delivery in deliveries:
            transaction.on_commit(partial(webhook_send, delivery_id=str(delivery.id), attempt=0))


def webhook_send(*, delivery_id: str, attempt: int) -> bool:
    """Send the message for attempt ``attempt + 1`` of a delivery. Never raises: a delivery whose
    message could not be sent is sent again by :func:`webhooks_send_due`."""
    try:
        celery_app.send_task(DELIVER_WEBHOOK_TASK, args=[delivery_id, attempt])
    except Exception:  # noqa: BLE001 - any broker failure; the row is the truth
        logger.warning("Could not send webhook delivery %s; it is sent again later", delivery_id, exc_info=True)
        return False
    return True


def webhooks_send_due(*, limit: int = 500) -> int:
    """Send the message of every pending delivery whose next attempt is due (a retry whose time
    came, or a message lost), pushing its ``next_attempt_at`` on so that the next sweep does not
    send it again while this message waits. Returns how many were sent."""
    now = timezone.now()
    due = WebhookDelivery.objects.filter(status=WebhookDeliveryStatus.PENDING, next_attempt_at__lte=now)
    sent = 0
    for delivery_id, attempts, next_at in due.order_by("next_attempt_at").values_list(
            "id", "attempts", "next_attempt_at")[:limit]:
        marked = WebhookDelivery.objects.filter(
            id=delivery_id, status=WebhookDeliveryStatus.PENDING, attempts=attempts, next_attempt_at=next_at,
        ).update(next_attempt_at=now + redispatch_after())
        if marked:
            sent += webhook_send(delivery_id=str(delivery_id), attempt=attempts)
    return sent


def webhook_redeliver(*, delivery_id: str) -> bool:
    """Operator action: send a delivered or failed delivery again now, with a new retry window
    (the same body and ``webhook-id``: a receiver that drops duplicates drops it too). Returns
    False for a pending delivery: its attempts go on by themselves."""
    now = timezone.now()
    with transaction.atomic():
        rows = WebhookDelivery.objects.filter(id=delivery_id).exclude(status=WebhookDeliveryStatus.PENDING)
        attempts = rows.values_list("attempts", flat=True).first()
        if attempts is None or not rows.update(status=WebhookDeliveryStatus.PENDING, delivered_at=None,
                                               next_attempt_at=now + redispatch_after(),
                                               retry_until=now + retry_window()):
            return False
        transaction.on_commit(partial(webhook_send, delivery_id=str(delivery_id), attempt=attempts))
    return True


JOB_DELETED = "not sent: the job was deleted"


def job_deliveries_erase(*, job_id: str) -> list[tuple[int | None, str]]:
    """A job's delete, in its transaction: clear the bodies of the job's deliveries and end the
    pending ones (``failed``, never sent again). Returns their (API key id, delivery id) pairs, for
    :func:`api.webhooks.slots.slots_wait_released` once the delete commits."""
    deliveries = WebhookDelivery.objects.filter(job_id=job_id)
    deliveries.filter(status=WebhookDeliveryStatus.PENDING).update(status=WebhookDeliveryStatus.FAILED,
                                                                  last_error=JOB_DELETED)
    deliveries.exclude(payload="").update(payload="")
    return [(key_id, str(delivery_id)) for delivery_id, key_id in deliveries.values_list("id", "api_key_id")]


def webhook_deliveries_purge(*, older_than_days: int) -> int:
    """Delete the deliveries (and their attempts) that ended more than ``older_than_days`` ago,
    as finished jobs are purged (JOB_RETENTION_DAYS). Pending ones stay."""
    cutoff = timezone.now() - dt.timedelta(days=older_than_days)
    deleted, _ = WebhookDelivery.objects.exclude(status=WebhookDeliveryStatus.PENDING).filter(
        created_at__lt=cutoff).delete()
    return deleted
