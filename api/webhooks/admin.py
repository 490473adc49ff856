"""Operators' admin of webhook deliveries: each with its attempts (status code, error, duration,
time), and an action that sends delivered or failed ones again."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from api.webhooks.models import WebhookAttempt, WebhookDelivery
from api.webhooks.services import webhook_redeliver

DELIVERY_FIELDS = ("id", "event_id", "event_type", "url", "status", "attempts", "created_at", "next_attempt_at",
                   "retry_until", "delivered_at", "last_status_code", "last_error", "api_key", "job", "payload")


class WebhookAttemptInline(admin.TabularInline):
    model = WebhookAttempt
    extra = 0
    can_delete = False
    fields = ("number", "started_at", "duration_ms", "status_code", "error", "response_excerpt")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = ("event_type", "event_id", "url", "status", "attempts", "last_status_code", "created_at",
                    "next_attempt_at", "delivered_at")
    list_filter = ("status", "event_type", "last_status_code")
    search_fields = ("event_id", "url", "job__id", "api_key__prefix")
    date_hierarchy = "created_at"
    readonly_fields = DELIVERY_FIELDS
    fields = DELIVERY_FIELDS
    inlines = (WebhookAttemptInline,)
    actions = ("redeliver",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # deliveries are made by the events they announce

    def has_change_permission(self, request: HttpRequest, obj: WebhookDelivery | None = None) -> bool:
        return False  # their state changes through the services (the action below)

    @admin.action(description="Send selected deliveries again now (delivered or failed ones)")
    def redeliver(self, request: HttpRequest, queryset: QuerySet[WebhookDelivery]) -> None:
        sent = sum(webhook_redeliver(delivery_id=str(pk)) for pk in queryset.values_list("id", flat=True))
        skipped = queryset.count() - sent
        self.message_user(request, f"Sending {sent} delivery(ies) again"
                                   + (f"; {skipped} still pending were left to their retries." if skipped else "."))
