"""Operators' admin of the Files and Batch APIs: files (deleted with their bytes) and batches
(progress, cancel)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from api.batches.file_services import file_delete
from api.batches.models import Batch, File
from api.batches.selectors import batch_request_counts, with_request_counts
from api.batches.services import batch_cancel
from api.common.errors import ServiceError


@admin.register(File)
class FileAdmin(admin.ModelAdmin):
    list_display = ("id", "owner", "purpose", "filename", "bytes", "lines", "created_at")
    list_filter = ("purpose",)
    search_fields = ("id", "filename", "owner__username")
    readonly_fields = ("id", "owner", "purpose", "filename", "bytes", "lines", "storage_name", "created_at")
    actions = ("delete_files",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # files come through the API, checked line by line

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # the action below deletes the bytes with the row

    @admin.action(description="Delete selected files and their bytes")
    def delete_files(self, request: HttpRequest, queryset: QuerySet[File]) -> None:
        done, errors = 0, []
        for file in queryset.select_related("owner"):
            try:
                file_delete(file_id=file.id, owner=file.owner)
                done += 1
            except ServiceError as exc:
                errors.append(f"{file.id}: {exc.message}")
        self.message_user(request, f"Deleted {done} file(s).")
        for error in errors:
            self.message_user(request, error, level=messages.WARNING)


@admin.register(Batch)
class BatchAdmin(admin.ModelAdmin):
    list_display = ("id", "owner", "status", "progress", "endpoint", "created_at", "expires_at")
    list_filter = ("status", "endpoint")
    search_fields = ("id", "owner__username", "input_file_id")
    date_hierarchy = "created_at"
    actions = ("cancel_batches",)
    readonly_fields = [field.name for field in Batch._meta.fields] + ["progress"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Batch]:
        return with_request_counts(super().get_queryset(request))

    @admin.display(description="progress")
    def progress(self, batch: Batch) -> str:
        counts = batch_request_counts(batch)
        total, done = counts["total"], counts["completed"] + counts["failed"]
        return format_html('<progress value="{}" max="{}" title="{} completed, {} failed"></progress> {}/{}',
                           done, max(total, 1), counts["completed"], counts["failed"], done, total)

    @admin.action(description="Cancel selected batches")
    def cancel_batches(self, request: HttpRequest, queryset: QuerySet[Batch]) -> None:
        done, errors = 0, []
        for batch in queryset.select_related("owner"):
            try:
                batch_cancel(batch_id=batch.id, owner=batch.owner)
                done += 1
            except ServiceError as exc:
                errors.append(f"{batch.id}: {exc.message}")
        self.message_user(request, f"Cancelled or asked to stop {done} batch(es).")
        for error in errors:
            self.message_user(request, error, level=messages.WARNING)
