"""Reads of jobs: lookups scoped to an owner, the list and its filters, the text so far, the queue
position, the detail that GET /jobs/<id> shows, and the counts the dashboard and metrics show."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import redis
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import BooleanField, Count, Q, QuerySet, Sum
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce
from django.utils import timezone

from api.common import redis_keys
from api.common.errors import JobNotFound
from api.common.redis_client import get_redis
from api.jobs.logprobs import job_logprobs
from api.models import Job, JobStatus
from api.serving.workers import model_served

logger = logging.getLogger(__name__)


def job_get(*, job_id: uuid.UUID | str, owner: User | None = None) -> Job:
    """The job, or JobNotFound. With ``owner``, another user's job is "not found" too (never 403:
    ids of other users' jobs must not be confirmable), and so is a job its owner deleted."""
    jobs = Job.objects.all() if owner is None else Job.objects.filter(owner=owner, deleted_at__isnull=True)
    try:
        return jobs.get(id=job_id)
    except (Job.DoesNotExist, ValueError):
        raise JobNotFound(job_id) from None


def job_list(*, owner: User, status: str | None = None,
             metadata: dict[str, str] | None = None) -> QuerySet[Job]:
    """The owner's jobs, newest first; with ``metadata``, only those whose metadata has every
    one of those pairs."""
    # The list never shows log probabilities (job_detail's with_logprobs): not read either.
    jobs = Job.objects.filter(owner=owner, deleted_at__isnull=True).defer("logprobs").order_by("-created_at", "-id")
    if status:
        jobs = jobs.filter(status=status)
    for i, (key, value) in enumerate((metadata or {}).items()):
        jobs = _with_metadata_pair(jobs, i, key, value)
    return jobs


def _with_metadata_pair(jobs: QuerySet[Job], i: int, key: str, value: str) -> QuerySet[Job]:
    """Jobs whose metadata maps ``key`` to ``value``. Not Django's key transforms: they read a key
    that looks like an integer ("2024", "-1") as an array index."""
    if connection.vendor == "postgresql":
        return jobs.filter(metadata__contains={key: value})  # jsonb @>: that exact key and value
    # SQLite has no JSON containment; json_each lists the object's keys and their text values.
    column = f"{connection.ops.quote_name(Job._meta.db_table)}.{connection.ops.quote_name('metadata')}"
    pair = RawSQL(f"EXISTS (SELECT 1 FROM json_each({column}) AS m WHERE m.key = %s AND m.value = %s)",
                  (key, value), output_field=BooleanField())
    return jobs.alias(**{f"_metadata_{i}": pair}).filter(**{f"_metadata_{i}": True})


def job_queue_position(*, job: Job) -> int | None:
    """How many queued jobs are ahead of this one (0: next to be admitted), in the engine's
    admission order (priority, then arrival). None once the job has left the queue."""
    if job.status != JobStatus.QUEUED:
        return None
    ahead = Q(priority__lt=job.priority) | Q(priority=job.priority, queued_at__lt=job.queued_at)
    # Only its model's workers run it: other models' jobs are not ahead of it.
    return Job.objects.filter(ahead, status=JobStatus.QUEUED, model=job.model).count()  # job_status_queue_order


def job_worker_loads(*, model: str, worker_ids: Iterable[str]) -> dict[str, int]:
    """Each of ``worker_ids``' active jobs of ``model``: those it runs, and those queued for it by
    prefix-affinity routing (api/jobs/services/queue_routing.py)."""
    loads = dict.fromkeys(worker_ids, 0)
    rows = (Job.objects.filter(model=model, status__in=(JobStatus.QUEUED, JobStatus.IN_PROGRESS))  # job_model_active
            .annotate(worker=Coalesce("worker_id", "routed_worker")).filter(worker__in=list(loads))
            .values("worker").annotate(n=Count("id")).order_by())
    for row in rows:
        loads[row["worker"]] = row["n"]
    return loads


def job_streamed_text(*, job_id: str) -> str | None:
    """The text of a job's chunks in its Redis stream, in seq order; None if Redis is down."""
    try:
        entries = get_redis().xrange(redis_keys.job_stream_key(job_id))
    except redis.RedisError:
        logger.warning("Could not read the stream of job %s", job_id, exc_info=True)
        return None
    chunks: dict[int, str] = {}
    for _entry_id, fields in entries or ():
        if fields is None or fields.get("type", "delta") != "delta":
            continue  # the final entry repeats the last seq with no text
        try:
            chunks[int(fields[redis_keys.JOB_STREAM_FIELD_SEQ])] = str(fields.get(redis_keys.JOB_STREAM_FIELD_TEXT, ""))
        except (KeyError, ValueError):
            continue
    return "".join(chunks[seq] for seq in sorted(chunks))


def job_output_text(*, job: Job) -> str:
    """The output so far: from the stream while the job runs, from the row once it has ended."""
    if job.status == JobStatus.IN_PROGRESS:
        streamed = job_streamed_text(job_id=str(job.id))
        if streamed:
            return streamed
    return job.output_text


def job_detail(*, job: Job, with_logprobs: bool = True) -> dict[str, Any]:
    """Everything GET /jobs/<id> shows (the shape of JobSerializer). ``with_logprobs=False`` (the
    list's form) leaves them out: a page of long jobs would carry megabytes of them."""
    return {
        "id": job.id,
        "object": "job",
        "status": job.status,
        "queue_position": job_queue_position(job=job),
        "model": job.model,
        # As the 202 says it: whatever the job's status, whether a live worker serves its model.
        "model_served": model_served(job.model),
        "output_text": job_output_text(job=job),
        "finish_reason": job.finish_reason,
        "cancel_requested": job.cancel_requested,
        "params": job.params,
        "priority": job.priority,
        "metadata": job.metadata,
        "webhook_url": job.webhook_url or None,
        "response_format": job.response_format,
        "tools": job.tools,
        "logprobs": job_logprobs(job.logprobs, model=job.model) if with_logprobs and job.is_finished else None,
        "usage": {
            "prompt_tokens": job.prompt_tokens,
            "cached_tokens": job.cached_tokens,
            "completion_tokens": job.completion_tokens,
            "total_tokens": job.total_tokens,
        },
        "timings": {
            "created_at": job.created_at,
            "queued_at": job.queued_at,
            "started_at": job.started_at,
            "first_token_at": job.first_token_at,
            "finished_at": job.finished_at,
            "ttft_ms": job.ttft_ms,
            "tokens_per_second": job.tokens_per_second(now=timezone.now()),
        },
        "worker_id": job.worker_id,
        "error": job.error,
    }


def job_status_counts() -> dict[str, int]:
    counts = {choice: 0 for choice in JobStatus.values}
    for row in Job.objects.values("status").annotate(n=Count("id")):
        counts[row["status"]] = row["n"]
    return counts


def job_throughput(*, window_s: int = 60) -> dict[str, float]:
    """Jobs and completion tokens finished in the last ``window_s`` seconds."""
    since = timezone.now() - timedelta(seconds=window_s)
    row = Job.objects.filter(finished_at__gte=since).aggregate(jobs=Count("id"), tokens=Sum("completion_tokens"))
    tokens = row["tokens"] or 0
    return {"window_s": window_s, "jobs": row["jobs"], "completion_tokens": tokens,
            "tokens_per_second": round(tokens / window_s, 3)}


def job_queued_count() -> int:
    """Jobs waiting for a worker to claim them (one index range count)."""
    return Job.objects.filter(status=JobStatus.QUEUED).count()
