"""Files and batches: OpenAI's Files and Batch APIs over the service's jobs.

A :class:`File` is a row and its bytes in the ``files`` storage (settings.STORAGES). A
:class:`Batch` runs the lines of its input file, each as a :class:`api.models.Job` that names the
batch and its line's ``custom_id``; its output and error files are built from those jobs' rows
when it ends (api/batches/output.py). Only services change a batch's status.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone


def _file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def _batch_id() -> str:
    return f"batch_{secrets.token_hex(12)}"


class FilePurpose(models.TextChoices):
    BATCH = "batch"
    BATCH_OUTPUT = "batch_output"


class File(models.Model):
    """An uploaded batch input, or a batch's output or error file. ``storage_name`` is its name in
    the ``files`` storage; the row is deleted with its bytes (api/batches/file_services.py)."""

    id = models.CharField(primary_key=True, max_length=40, default=_file_id, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="files")
    purpose = models.CharField(max_length=16, choices=FilePurpose.choices)
    filename = models.CharField(max_length=255)
    bytes = models.PositiveBigIntegerField(default=0)
    lines = models.PositiveIntegerField(default=0)
    storage_name = models.CharField(max_length=512, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["owner", "-created_at"], name="file_owner_created")]

    def __str__(self) -> str:
        return f"{self.id} ({self.filename})"


class BatchStatus(models.TextChoices):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


BATCH_TERMINAL_STATUSES = (BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED)
# Statuses in which the batch's jobs may still run.
BATCH_RUNNING_STATUSES = (BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING, BatchStatus.CANCELLING)


class Batch(models.Model):
    """One batch: its input file's lines run as jobs of ``api_key``. ``request_counts`` is filled
    when it ends (while it runs, the selectors count its jobs)."""

    id = models.CharField(primary_key=True, max_length=40, default=_batch_id, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="batches")
    api_key = models.ForeignKey("api.ApiKey", null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="batches")
    # An id, not a key: the input file may be deleted once the batch has ended.
    input_file_id = models.CharField(max_length=40)
    endpoint = models.CharField(max_length=32)
    completion_window = models.CharField(max_length=8, default="24h")
    metadata = models.JSONField(null=True, blank=True)
    # Called when the batch ends (the webhooks' delivery reads it).
    webhook_url = models.CharField(max_length=2048, blank=True)
    # The model of the lines, as the responses name it.
    model = models.CharField(max_length=255, blank=True)
    status = models.CharField(max_length=16, choices=BatchStatus.choices, default=BatchStatus.VALIDATING)
    # Why validation failed: OpenAI's {"object": "list", "data": [{"code", "message", "param", "line"}]}.
    errors = models.JSONField(null=True, blank=True)
    request_counts = models.JSONField(null=True, blank=True)
    output_file = models.ForeignKey(File, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    error_file = models.ForeignKey(File, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField()
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "batches"
        indexes = [
            models.Index(fields=["owner", "-created_at"], name="batch_owner_created"),
            models.Index(fields=["status"], name="batch_status"),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in BATCH_TERMINAL_STATUSES
