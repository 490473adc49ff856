"""Operators' admin of jobs: read-only rows, and actions that go through the services (cancel,
requeue, delete the content of finished ones as their owner's DELETE does)."""

from __future__ import annotations

from functools import partial

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from api.common.errors import ServiceError
from api.jobs.services.cancel import job_cancel
from api.jobs.services.deletion import job_delete
from api.jobs.services.requeue import job_requeue
from api.models import Job


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("id", "owner", "model", "status", "priority", "worker_id", "completion_tokens", "created_at",
                    "finished_at")
    list_filter = ("model", "status", "finish_reason", "worker_id", ("deleted_at", admin.EmptyFieldListFilter))
    search_fields = ("id", "owner__username", "idempotency_key", "worker_id")
    date_hierarchy = "created_at"
    actions = ("cancel_jobs", "requeue_jobs", "delete_job_content")
    readonly_fields = (
        "id", "owner", "api_key", "model", "status", "prompt", "messages", "prompt_token_ids", "params", "priority",
        "metadata", "idempotency_key", "request_fingerprint", "webhook_url", "response_format", "tools", "constraint",
        "output_text", "finish_reason", "error",
        "prompt_tokens", "cached_tokens", "completion_tokens", "worker_id", "routed_worker", "lease_expires_at",
        "dispatch_count",
        "cancel_requested", "last_seq", "created_at", "queued_at", "started_at", "first_token_at", "finished_at",
        "deleted_at", "ttft_ms", "tokens_per_second",
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs are created through the API, which validates and tokenizes them

    def has_change_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False  # status changes go through the actions, i.e. the services

    @admin.display(description="TTFT (ms)")
    def ttft_ms(self, obj: Job) -> float | None:
        return obj.ttft_ms

    @admin.display(description="tokens/s")
    def tokens_per_second(self, obj: Job) -> float | None:
        return obj.tokens_per_second(now=timezone.now())

    @admin.action(description="Cancel selected jobs")
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._apply(request, queryset, job_cancel, "Cancelled or asked to stop")

    @admin.action(description="Requeue selected jobs (failed, expired or cancelled)")
    def requeue_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._apply(request, queryset, job_requeue, "Requeued")

    @admin.action(description="Delete the content of selected finished jobs (as their owner's DELETE)")
    def delete_job_content(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        # Unlike the admin's own delete, the rows stay with their counts: the keys' quotas and usage
        # are unchanged (api/jobs/services/deletion.py).
        self._apply(request, queryset, partial(job_delete, owner=None), "Deleted the content of")

    def _apply(self, request: HttpRequest, queryset: QuerySet[Job], service, verb: str) -> None:
        done, errors = 0, []
        for job_id in queryset.values_list("id", flat=True):
            try:
                service(job_id=job_id)
                done += 1
            except ServiceError as exc:
                errors.append(f"{job_id}: {exc.message}")
        self.message_user(request, f"{verb}: {done} job(s).")
        for error in errors:
            self.message_user(request, error, messages.WARNING)
