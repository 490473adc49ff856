"""Jobs: one text-generation request and its result.

Only services change a Job's status, with conditional UPDATEs, so a duplicate delivery or a late
worker never moves a job backwards (see api/jobs/services/).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from api.batches.models import Batch
from api.jobs.fields import LosslessTextField
from api.keys.models import ApiKey


def _default_model() -> str:
    from api.serving.catalog import default_model_name

    return default_model_name()


class JobStatus(models.TextChoices):
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @classmethod
    def for_finish_reason(cls, reason: str | None) -> JobStatus:
        """The status a job ends in for the engine's finish reason (engine_worker.protocol's
        FINISH_REASONS): ``stop`` and ``length`` complete it, ``abort`` cancels it, and ``error``
        (or anything unknown) fails it."""
        if reason in ("stop", "length"):
            return cls.COMPLETED
        if reason == "abort":
            return cls.CANCELLED
        return cls.FAILED


ACTIVE_STATUSES = (JobStatus.QUEUED, JobStatus.IN_PROGRESS)
TERMINAL_STATUSES = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED)

# What a job's ``params`` hold for the sampling settings its request left out (max_tokens has its
# own default, settings.DEFAULT_MAX_TOKENS, bounded by the key and the context).
SAMPLING_DEFAULTS: dict[str, Any] = {
    "temperature": 0.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "logit_bias": {},
    "logprobs": None,
    "seed": None,
    "stop": [],
}


class Job(models.Model):
    """One text-generation request and its result."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="jobs")
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs")
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED)
    # The configured model that runs it: only a worker of that model claims it (api/serving/catalog.py).
    model = models.CharField(max_length=128, default=_default_model)

    prompt = models.TextField(blank=True)
    messages = models.JSONField(null=True, blank=True)
    prompt_token_ids = models.JSONField(default=list)
    # max_tokens and the sampling settings (SAMPLING_DEFAULTS' keys); stop is a list of strings.
    params = models.JSONField(default=dict)
    # The client's own labels (api/jobs/metadata.py): returned with the job, a filter of the list.
    metadata = models.JSONField(default=dict, blank=True)
    # Called once the job ends (api/webhooks/job_events.py); empty: none.
    webhook_url = models.CharField(max_length=2048, blank=True, default="")
    priority = models.IntegerField(default=10)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    # SHA-256 of the canonical request body, to tell a retry from a reuse of the same key.
    request_fingerprint = models.CharField(max_length=64, blank=True)

    # What the model generated, exactly: it may hold NUL, which PostgreSQL's text refuses.
    output_text = LosslessTextField(blank=True)
    # With params["logprobs"] set: [token id, log probability, [[token id, log probability], ...]]
    # per completion token, written with the final (api/jobs/logprobs.py renders it).
    logprobs = models.JSONField(null=True, blank=True)
    # Structured output: the request's response_format and tools (OpenAI's shapes: tools, tool_choice,
    # parallel_tool_calls), and the engine constraint they compiled to ({"kind", "text"}; see
    # engine_worker.common.request.Constraint), which the worker sends with the job.
    response_format = models.JSONField(null=True, blank=True)
    tools = models.JSONField(null=True, blank=True)
    constraint = models.JSONField(null=True, blank=True)
    finish_reason = models.CharField(max_length=16, null=True, blank=True)
    error = models.TextField(null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)

    worker_id = models.CharField(max_length=128, null=True, blank=True)
    # The worker prefix-affinity routing sent it to (null: the model's shared queue); with
    # worker_id, what the router counts as a worker's load (api/jobs/services/queue_routing.py).
    routed_worker = models.CharField(max_length=128, null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    dispatch_count = models.PositiveIntegerField(default=0)
    # Claims so far: a job that runs again (its worker died) restarts its stream (api/worker/admission.py).
    attempts = models.PositiveIntegerField(default=0)
    cancel_requested = models.BooleanField(default=False)
    last_seq = models.PositiveIntegerField(default=0)

    created_at = models.DateTimeField(default=timezone.now, editable=False)
    queued_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    first_token_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Set when the owner deleted the job: its content is gone, its counts stay for the quotas and
    # usage (services/deletion.py), and every user-facing read treats it as not found.
    deleted_at = models.DateTimeField(null=True, blank=True, editable=False)
    # A line of a batch (api/batches/models.py): its batch and the line's custom_id. Such a job is
    # sent to the engine by the batch feeder (api/batches/feed.py), not on its creation.
    batch = models.ForeignKey(Batch, null=True, blank=True, on_delete=models.CASCADE, related_name="jobs")
    custom_id = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "idempotency_key"],
                condition=models.Q(idempotency_key__isnull=False),
                name="job_unique_idempotency_key_per_owner",
            ),
            models.UniqueConstraint(fields=["batch", "custom_id"], condition=models.Q(batch__isnull=False),
                                    name="job_unique_custom_id_per_batch"),
        ]
        indexes = [
            models.Index(fields=["owner", "-created_at"], name="job_owner_created"),
            models.Index(fields=["status", "priority", "queued_at"], name="job_status_queue_order"),
            # The quota gate sums the tokens of a key's jobs finished today on every submission: it
            # reads them from this index alone, not from the rows (whose prompts fill pages).
            models.Index(fields=["api_key", "created_at", "status", "prompt_tokens", "completion_tokens"],
                         name="job_key_day_tokens"),
            # The quota gate counts a key's queued and running jobs on every submission.
            models.Index(fields=["api_key"], condition=models.Q(status__in=["queued", "in_progress"]),
                         name="job_key_active"),
            # The batch feeder (api/batches/feed.py) counts a key's batch jobs in flight,
            # picks its held ones oldest first, and asks whether a batch still has jobs to run: each
            # read stays within the few rows it needs, whatever the size of the batch.
            models.Index(fields=["api_key"], name="job_key_batch_in_flight",
                         condition=models.Q(batch__isnull=False)
                         & (models.Q(status="in_progress") | models.Q(status="queued", dispatch_count__gt=0))),
            models.Index(fields=["api_key", "created_at"], name="job_key_batch_held",
                         condition=models.Q(batch__isnull=False, status="queued", dispatch_count=0)),
            models.Index(fields=["batch"], name="job_batch_active",
                         condition=models.Q(batch__isnull=False, status__in=["queued", "in_progress"])),
            # Routing counts each live worker's active jobs of a model on submissions.
            models.Index(fields=["model"], condition=models.Q(status__in=["queued", "in_progress"]),
                         name="job_model_active"),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def max_tokens(self) -> int:
        return int(self.params.get("max_tokens", 0))

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def ttft_ms(self) -> float | None:
        """Time to first token, from entering the queue (what the client waits)."""
        if self.first_token_at is None:
            return None
        return round((self.first_token_at - self.queued_at).total_seconds() * 1000.0, 3)

    def tokens_per_second(self, *, now: datetime | None = None) -> float | None:
        """Decode rate: tokens after the first over the time since the first token (until the end,
        or ``now`` while running)."""
        if self.first_token_at is None or self.completion_tokens < 2:
            return None
        end = self.finished_at or now or timezone.now()
        seconds = (end - self.first_token_at).total_seconds()
        if seconds <= 0:
            return None
        return round((self.completion_tokens - 1) / seconds, 3)
