"""The webhooks' Celery tasks: ``deliver_webhook`` makes one attempt of a delivery (on the webhooks
worker's queue), and ``send_due_webhooks`` (beat, on the light worker) sends those whose retry is
due or whose message was lost (api/webhooks/services.py). Their names stay ``api.tasks.<name>`` (api/jobs/tasks.py says why)."""

from __future__ import annotations

from celery import shared_task

from api.webhooks import delivery as webhook_delivery
from api.webhooks import services as webhooks


@shared_task(name="api.tasks.deliver_webhook", ignore_result=True)
def deliver_webhook(delivery_id: str, attempt: int) -> str | None:
    """Attempt ``attempt + 1`` of a webhook delivery (nothing if it was made already)."""
    return webhook_delivery.webhook_deliver(delivery_id=delivery_id, attempt=int(attempt))


@shared_task(name="api.tasks.send_due_webhooks", ignore_result=True)
def send_due_webhooks() -> int:
    """Send the webhook deliveries whose next attempt is due."""
    return webhooks.webhooks_send_due()
