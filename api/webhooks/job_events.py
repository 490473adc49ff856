"""A job's webhook: one delivery when the job ends (completed, failed, cancelled or expired).

Every service that moves a job to a terminal status calls :func:`job_webhooks_enqueue` in the
transaction of that change: the engine worker's finals (api/jobs/services/outputs.py), a failure
(job_fail), the cancel of a queued job (jobs.job_cancel), the cancel of a job whose worker died
(job_lifecycle.job_hand_back) and expiry (jobs_expire_queued). The delivery commits with the status.
A cancel sends its Celery message on commit; the transitions of api/jobs/services/lifecycle.py, made by the
engine workers and the light worker's periodic tasks, leave theirs to ``send_due_webhooks``
(api/webhooks/services.py says why).

The event id is the job's id and its ``queued_at``: a job ends once per time it is queued (only an
operator's requeue queues it anew, with a new ``queued_at``), so a second path that records the
same end (a late worker's final after the reconciler cancelled the job) adds nothing.

The body's ``data`` is the job as ``GET /api/v1/jobs/<id>`` shows it, rendered at the first attempt
on the webhooks worker rather than in the finals' transaction: the engine worker's I/O thread, which
writes every job's output, pays one SELECT and one INSERT for the jobs of a batch that named a
webhook, and nothing for the others (and never a round trip to the broker).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable

from api.jobs.selectors import job_detail
from api.jobs.serializers import JobSerializer
from api.models import TERMINAL_STATUSES, Job
from api.webhooks.models import WebhookDelivery
from api.webhooks.services import webhook_body, webhooks_enqueue


def job_event_id(*, job_id: uuid.UUID | str, queued_at: dt.datetime) -> str:
    """The ``webhook-id`` of the end of the job's run queued at ``queued_at``."""
    return f"job_{uuid.UUID(str(job_id)).hex}_{int(queued_at.timestamp() * 1_000_000)}"


def job_webhooks_enqueue(*, job_ids: Iterable[uuid.UUID | str], send: bool = True) -> int:
    """Record the end of each of these jobs that has ended and named a webhook URL (in the
    caller's transaction, after its status change); ``send``: as for
    :func:`api.webhooks.services.webhooks_enqueue`. Returns how many it recorded or found."""
    rows = (Job.objects.filter(id__in=list(job_ids), status__in=TERMINAL_STATUSES).exclude(webhook_url="")
            .values_list("id", "api_key_id", "webhook_url", "status", "queued_at"))
    deliveries = [
        WebhookDelivery(event_id=job_event_id(job_id=job_id, queued_at=queued_at), event_type=f"job.{status}",
                        url=url, api_key_id=api_key_id, job_id=job_id)
        for job_id, api_key_id, url, status, queued_at in rows
    ]
    webhooks_enqueue(deliveries=deliveries, send=send)
    return len(deliveries)


def job_webhook_payload(*, job_id: str, event_type: str, at: dt.datetime) -> str | None:
    """The body of a job's event: the job as its owner reads it now. None if the job is gone
    (purged, or deleted by its owner: its content is no one's to send)."""
    job = Job.objects.filter(id=job_id, deleted_at__isnull=True).first()
    if job is None:
        return None
    return webhook_body(event_type=event_type, at=at, data=dict(JobSerializer(job_detail(job=job)).data))
