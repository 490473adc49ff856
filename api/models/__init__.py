"""Every model of the app, for Django's app registry (it imports ``api.models``) and for code that
names them as ``api.models.Job``. Each model lives in its domain's folder.

The migrations name the default callables of some fields by this module's path
(``api.models._default_rpm``...): they are imported here for them.
"""

from api.batches.models import Batch, BatchStatus, File, FilePurpose
from api.jobs.models import (
    ACTIVE_STATUSES,
    SAMPLING_DEFAULTS,
    TERMINAL_STATUSES,
    Job,
    JobStatus,
    _default_model,
)
from api.keys.models import (
    WEBHOOK_SECRET_PREFIX,
    ApiKey,
    QuotaHold,
    UsageRecord,
    _default_max_concurrent,
    _default_max_tokens_per_job,
    _default_rpm,
    _default_tokens_per_day,
    new_webhook_secret,
)
from api.webhooks.models import WebhookAttempt, WebhookDelivery, WebhookDeliveryStatus

__all__ = [
    "ACTIVE_STATUSES",
    "SAMPLING_DEFAULTS",
    "TERMINAL_STATUSES",
    "WEBHOOK_SECRET_PREFIX",
    "ApiKey",
    "Batch",
    "BatchStatus",
    "File",
    "FilePurpose",
    "Job",
    "JobStatus",
    "QuotaHold",
    "UsageRecord",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookDeliveryStatus",
    "_default_max_concurrent",
    "_default_max_tokens_per_job",
    "_default_model",
    "_default_rpm",
    "_default_tokens_per_day",
    "new_webhook_secret",
]
