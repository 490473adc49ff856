"""The batch feeder: sends a key's batch jobs to the engine a few at a time.

A batch's jobs are inserted queued but not sent (``dispatch_count`` 0: *held*). The feeder sends
the next held jobs of a key's running batches while fewer than BATCH_JOBS_IN_FLIGHT_PER_KEY of
the key's batch jobs are sent and not finished (queued in the engine or running), and while the
key's daily tokens cover them (api/keys/quotas.py counts a batch job's tokens once it is
sent). So a batch never floods the engine's queue: the engine admits an interactive job, more
urgent by its priority (BATCH_JOB_PRIORITY is less urgent than any key's class), before the few
batch jobs waiting there, and a key's batch cannot take more of the engine than the cap.

It runs on the light worker: after a batch starts, whenever batch jobs end (the engine worker's
sink asks for it, :func:`batch_progress_send`, once per batch), and on beat's tick (api/batches/tasks.py), which also covers
a lost message. A sent job is an ordinary queued job from then on: the reconciler sends it again
if its message is lost, and hands it on if its worker dies.
"""

from __future__ import annotations

import datetime as dt
import logging
from functools import partial

import redis
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from kombu.exceptions import KombuError

from api.batches.models import BatchStatus
from api.jobs.services.dispatch import job_dispatch_counted
from api.keys.quotas import quota_key_usage
from api.models import ApiKey, Job, JobStatus
from inference_service.celery import app as celery_app

logger = logging.getLogger(__name__)

BATCH_PROGRESS_TASK = "api.tasks.batch_progress"

# A key's batch jobs that the feeder has sent and that have not finished, and those it has not
# sent: as the partial indexes of api/jobs/models.py state them, so that each query uses its index.
IN_FLIGHT = Q(batch__isnull=False) & (Q(status=JobStatus.IN_PROGRESS) | Q(status=JobStatus.QUEUED, dispatch_count__gt=0))
HELD = Q(batch__isnull=False, status=JobStatus.QUEUED, dispatch_count=0)


def batch_feed(*, api_key_id: int) -> list[str]:
    """Send the key's next held batch jobs, within its cap and its daily tokens. Returns the ids
    sent. The key's row is locked meanwhile (as the quota gate locks it), so two feeders never
    both fill the last places."""
    cap = settings.BATCH_JOBS_IN_FLIGHT_PER_KEY
    with transaction.atomic():
        key = ApiKey.objects.select_for_update(no_key=True).filter(id=api_key_id, revoked_at__isnull=True).first()
        if key is None:
            return []
        jobs = Job.objects.filter(api_key_id=api_key_id)
        room = cap - jobs.filter(IN_FLIGHT).count()
        if room <= 0:
            return []
        now = timezone.now()
        tokens_left = key.tokens_per_day - quota_key_usage(api_key=key, now=now).tokens_used
        # Oldest first: a key's batches run in the order they started, each in its input's order.
        candidates = (jobs.filter(HELD, cancel_requested=False, batch__status=BatchStatus.IN_PROGRESS)
                      .order_by("created_at")
                      .values_list("id", "prompt_token_ids", "params")[:room])
        chosen = []
        for job_id, prompt_token_ids, params in candidates:
            need = len(prompt_token_ids) + int(params.get("max_tokens", 0))
            if need > tokens_left:
                break  # in order: the rest wait for tomorrow's tokens (or the batch's window ends)
            tokens_left -= need
            chosen.append(str(job_id))
        if not chosen:
            return []
        # As job_create counts its send: dispatch_count 1 now, taken back if the send fails (the
        # job is then held again). The claim deadline lets the reconciler resend a lost message.
        Job.objects.filter(id__in=chosen, status=JobStatus.QUEUED, dispatch_count=0).update(
            dispatch_count=1, queued_at=now,
            lease_expires_at=now + dt.timedelta(seconds=float(settings.JOB_REDISPATCH_AFTER_S)))
        transaction.on_commit(partial(_send, chosen))
    return chosen


def _send(job_ids: list[str]) -> None:
    for job_id in job_ids:
        job_dispatch_counted(job_id=job_id, precounted=True)


def batch_keys_to_feed() -> list[int]:
    """The keys with held jobs in running batches."""
    rows = Job.objects.filter(HELD, batch__status=BatchStatus.IN_PROGRESS, api_key__isnull=False)
    return sorted(set(rows.values_list("api_key_id", flat=True)))


def batch_progress_send(*, api_key_id: int | None, batch_id: str) -> None:
    try:
        celery_app.send_task(BATCH_PROGRESS_TASK, args=[api_key_id, batch_id])
    except (KombuError, redis.RedisError, OSError):
        logger.warning("could not ask for the progress of batch %s; beat's tick will", batch_id, exc_info=True)
