"""API keys and their daily usage.

A user's key is stored as the SHA-256 of its secret and a visible prefix; its quotas are columns of
its row (api/keys/quotas.py applies them). Each key also holds the secret that signs the webhooks
of its jobs.
"""

from __future__ import annotations

import base64
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone


def _default_rpm() -> int:
    return settings.DEFAULT_KEY_REQUESTS_PER_MINUTE


def _default_tokens_per_day() -> int:
    return settings.DEFAULT_KEY_TOKENS_PER_DAY


def _default_max_concurrent() -> int:
    return settings.DEFAULT_KEY_MAX_CONCURRENT_JOBS


def _default_max_tokens_per_job() -> int:
    return settings.DEFAULT_KEY_MAX_TOKENS_PER_JOB


WEBHOOK_SECRET_PREFIX = "whsec_"


def new_webhook_secret() -> str:
    """A Standard Webhooks signing secret: ``whsec_`` and 32 random bytes in base64 (the spec asks
    for 24 to 64)."""
    return WEBHOOK_SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


class ApiKey(models.Model):
    """A user's API key. Only the SHA-256 of the secret is stored, plus a visible prefix."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, db_index=True, editable=False)
    hashed_key = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    # Quotas; 0 means "none allowed" for the counters, so a key can be paused without revoking it.
    requests_per_minute = models.PositiveIntegerField(default=_default_rpm)
    tokens_per_day = models.PositiveBigIntegerField(default=_default_tokens_per_day)
    max_concurrent_jobs = models.PositiveIntegerField(default=_default_max_concurrent)
    max_tokens_per_job = models.PositiveIntegerField(default=_default_max_tokens_per_job)
    # Priority class of the key's jobs: lower is more urgent; a request may ask for less urgency,
    # never for more.
    priority = models.PositiveSmallIntegerField(default=10)
    # Signs the webhooks of the key's jobs (api/webhooks/signing.py). Kept as is, since signing
    # needs it (as Stripe and Svix keep theirs); shown once, when it is made or rotated.
    webhook_secret = models.CharField(max_length=100, default=new_webhook_secret, editable=False)
    # The models the key may use, by name; empty: every model (api/jobs/services/submission.py checks it).
    allowed_models = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or 'unnamed'})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class QuotaHold(models.Model):
    """A job of the key admitted by the quota gate whose row has not committed yet: the gate counts
    it as one active job reserving ``tokens``. The job's INSERT deletes it in the same transaction,
    so any snapshot sees the hold or the job, never both, never neither (api/keys/quotas.py). A
    hold whose submission died before its INSERT expires after QUOTA_HOLD_S."""

    job_id = models.UUIDField(primary_key=True)
    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="+")
    tokens = models.PositiveBigIntegerField()
    created_at = models.DateTimeField()


class UsageRecord(models.Model):
    """Tokens and requests of one key on one UTC day, rolled up from its jobs' engine counts."""

    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="usage_records")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="usage_records")
    day = models.DateField()
    requests = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    cached_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-day"]
        constraints = [models.UniqueConstraint(fields=["api_key", "day"], name="usage_unique_key_day")]

    def __str__(self) -> str:
        return f"{self.api_key_id} {self.day}"

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens
