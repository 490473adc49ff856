"""Webhook deliveries and their attempts (api/webhooks/services.py sends them).

A delivery is one event for one URL: its ``event_id`` is unique, so an event recorded twice (a
retried write, two services racing to end a job) is delivered once. The row is the truth; Celery
messages only wake the webhooks worker, and a lost one is sent again by ``send_due_webhooks``.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone


class WebhookDeliveryStatus(models.TextChoices):
    PENDING = "pending"  # its next attempt is due at next_attempt_at
    DELIVERED = "delivered"  # a 2xx answered it
    FAILED = "failed"  # given up: retries ran out, 410 Gone, or nothing left to sign it with


class WebhookDelivery(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Sent as ``webhook-id``: the same on every attempt, so receivers can drop duplicates.
    event_id = models.CharField(max_length=128, unique=True)
    event_type = models.CharField(max_length=64)
    url = models.CharField(max_length=2048)
    # Signs the deliveries with its webhook secret, as it is at each attempt.
    api_key = models.ForeignKey("api.ApiKey", null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="webhook_deliveries")
    job = models.ForeignKey("api.Job", null=True, blank=True, on_delete=models.SET_NULL,
                            related_name="webhook_deliveries")
    # The exact body sent (its signature covers these bytes). A job's is rendered from its row at
    # the first attempt (api/webhooks/job_events.py), then kept, so every attempt sends the same.
    payload = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=WebhookDeliveryStatus.choices,
                              default=WebhookDeliveryStatus.PENDING)
    # Attempts claimed so far; a message names the attempt it is for, so a duplicate finds it taken.
    attempts = models.PositiveIntegerField(default=0)
    # Pending: when the next attempt is due (or, once its message is sent or its attempt claimed,
    # when to send it again if nothing came of it).
    next_attempt_at = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # A failed attempt is retried while its next time falls before this (WEBHOOK_RETRY_WINDOW_S).
    retry_until = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "webhook deliveries"
        indexes = [
            models.Index(fields=["next_attempt_at"], condition=models.Q(status="pending"),
                         name="webhook_delivery_due"),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} {self.event_id} ({self.status})"


class WebhookAttempt(models.Model):
    """One HTTP request of a delivery: what came back, or why nothing did."""

    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    duration_ms = models.FloatField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    # The start of the answer's body, for the operator reading why a receiver refused.
    response_excerpt = models.TextField(blank=True)

    class Meta:
        ordering = ["delivery", "number"]
        constraints = [models.UniqueConstraint(fields=["delivery", "number"], name="webhook_attempt_unique_number")]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.delivery_id}"
