"""One attempt of a webhook delivery, on the webhooks worker: take a slot, claim, sign, POST,
record, schedule.

An attempt first takes one of its API key's slots (api/webhooks/slots.py): when the key already has
WEBHOOK_CONCURRENCY_PER_KEY attempts running, this one is put off by DEFER_S without using up an
attempt, and ``send_due_webhooks`` sends it again.

An attempt claims its delivery with a conditional UPDATE on the attempt count, so two messages for
one attempt make one request. Its outcome is one WebhookAttempt row (status code or error,
duration, time) and the delivery's new state, written together:

- a 2xx: ``delivered``;
- 410 Gone: ``failed`` (the receiver says the endpoint is gone for good);
- anything else (a network error, a timeout, another status, a redirect, which is never
  followed, an address that is no longer allowed): retried after :func:`webhook_retry_delay`,
  until the next try would fall past the delivery's ``retry_until`` (WEBHOOK_RETRY_WINDOW_S, a
  day, after the event); then ``failed``.

A delivery of a revoked key is not sent (it ends ``failed``): a revoked key's secret is taken as
exposed, so its signature would prove nothing, and the key can no longer read its jobs either.
"""

from __future__ import annotations

import datetime as dt
import logging
import random

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from api.webhooks.http import WebhookResponse, webhook_post
from api.webhooks.job_events import job_webhook_payload
from api.webhooks.models import WebhookAttempt, WebhookDelivery, WebhookDeliveryStatus
from api.webhooks.services import redispatch_after
from api.webhooks.signing import webhook_headers
from api.webhooks.slots import key_slot

logger = logging.getLogger(__name__)

# Retries wait 10 s, 20 s, 40 s ... doubling up to 2 h: about 20 attempts in a day.
RETRY_BASE_S = 10.0
RETRY_MAX_DELAY_S = 2 * 3600.0
HTTP_GONE = 410
# How long an attempt whose key has no free slot waits before it is sent again.
DEFER_S = 1.0


def webhook_retry_delay(attempt: int, *, rng: random.Random | None = None) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1, 2, ...): between half and all of
    RETRY_BASE_S * 2^(attempt-1), at most RETRY_MAX_DELAY_S. The random half spreads the retries
    of many deliveries to a receiver that was down, so they do not all come back at once."""
    ceiling = min(RETRY_MAX_DELAY_S, RETRY_BASE_S * 2.0 ** max(0, attempt - 1))
    return ceiling / 2 + (rng or random).uniform(0.0, ceiling / 2)


def webhook_deliver(*, delivery_id: str, attempt: int) -> WebhookDeliveryStatus | None:
    """Make attempt ``attempt + 1`` of the delivery, if it is pending, that attempt is not taken and
    its key has a free slot. Returns the delivery's status after it, or None when there was nothing
    to do (or it was put off)."""
    pending = WebhookDelivery.objects.filter(id=delivery_id, status=WebhookDeliveryStatus.PENDING, attempts=attempt)
    key_ids = list(pending.values_list("api_key_id", flat=True)[:1])
    if not key_ids:
        return None
    with key_slot(api_key_id=key_ids[0], holder=delivery_id) as held:
        if not held:
            pending.update(next_attempt_at=timezone.now() + dt.timedelta(seconds=DEFER_S))
            return None
        return _attempt(pending, delivery_id=delivery_id, number=attempt + 1)


def _attempt(pending, *, delivery_id: str, number: int) -> WebhookDeliveryStatus | None:
    if not pending.update(attempts=number, next_attempt_at=timezone.now() + redispatch_after()):
        return None
    delivery = WebhookDelivery.objects.select_related("api_key").get(id=delivery_id)
    started_at = timezone.now()
    refusal = _refusal(delivery)
    if refusal or delivery.api_key is None:  # no key: a refusal
        response = WebhookResponse(None, refusal, "", 0.0)
        return _record(delivery, number, started_at, response, give_up=True)
    body = delivery.payload or _render(delivery)
    if body is None:
        response = WebhookResponse(None, "the job it was about no longer exists", "", 0.0)
        return _record(delivery, number, started_at, response, give_up=True)
    headers = webhook_headers(secret=delivery.api_key.webhook_secret, message_id=delivery.event_id, body=body,
                              at=started_at)
    response = webhook_post(url=delivery.url, body=body, headers=headers, timeout_s=settings.WEBHOOK_TIMEOUT_S,
                            connect_timeout_s=settings.WEBHOOK_CONNECT_TIMEOUT_S)
    return _record(delivery, number, started_at, response, give_up=response.status_code == HTTP_GONE)


def _refusal(delivery: WebhookDelivery) -> str:
    if delivery.api_key is None:
        return "not sent: the API key that signs it was deleted"
    if delivery.api_key.revoked_at is not None:
        return "not sent: the API key that signs it was revoked"
    return ""


def _render(delivery: WebhookDelivery) -> str | None:
    """A job's body, rendered from its row at the first attempt and kept for the others."""
    if delivery.job_id is None:
        return None
    body = job_webhook_payload(job_id=str(delivery.job_id), event_type=delivery.event_type, at=delivery.created_at)
    if body is not None:
        # Only while pending: a delete in between ended it (and must not find its body written back).
        WebhookDelivery.objects.filter(id=delivery.id, payload="", status=WebhookDeliveryStatus.PENDING).update(
            payload=body)
    return body


def _record(delivery: WebhookDelivery, number: int, started_at: dt.datetime, response: WebhookResponse, *,
            give_up: bool) -> WebhookDeliveryStatus:
    now = timezone.now()
    fields: dict = {"last_status_code": response.status_code, "last_error": response.error}
    if response.ok:
        status = WebhookDeliveryStatus.DELIVERED
        fields.update(delivered_at=now, last_error="")
    else:
        next_at = now + dt.timedelta(seconds=webhook_retry_delay(number))
        status = WebhookDeliveryStatus.FAILED if give_up or next_at > delivery.retry_until else \
            WebhookDeliveryStatus.PENDING
        if status == WebhookDeliveryStatus.PENDING:
            fields["next_attempt_at"] = next_at
    with transaction.atomic():
        WebhookAttempt.objects.create(delivery_id=delivery.id, number=number, started_at=started_at,
                                      duration_ms=response.duration_ms, status_code=response.status_code,
                                      error=response.error, response_excerpt=response.excerpt)
        # Only while this attempt is the delivery's latest (one that outlived its claim may not be).
        WebhookDelivery.objects.filter(id=delivery.id, attempts=number, status=WebhookDeliveryStatus.PENDING).update(
            status=status, **fields)
    if status == WebhookDeliveryStatus.DELIVERED:
        logger.info("webhook %s (%s) delivered to %s on attempt %s", delivery.event_id, delivery.event_type,
                    delivery.url, number)
    else:
        logger.warning("webhook %s attempt %s to %s: %s; %s", delivery.event_id, number, delivery.url,
                       response.status_code or response.error,
                       "retried later" if status == WebhookDeliveryStatus.PENDING else "given up")
    return status
