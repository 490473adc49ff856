"""Batches: create, start (its lines become jobs), cancel, expire, and end (:func:`batch_finalize`).

Statuses as OpenAI's: ``validating`` (created; the start task reads its input) → ``in_progress``
(its jobs run, fed to the engine by api/batches/feed.py) → ``finalizing`` (its files are
written) → ``completed``; or ``failed`` (a line could not become a job), ``cancelling`` →
``cancelled``, and ``expired`` (the completion window ended first). Every change is a conditional
UPDATE or happens under the batch's row lock, and every step can run again: the start, the
progress and the end are Celery tasks on the light worker, and beat's tick
(api/batches/tasks.py ``tick_batches``) runs again whatever a lost message or a dead process left undone.
"""

from __future__ import annotations

import datetime as dt
import logging
from functools import partial
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone
from kombu.exceptions import KombuError

from api.batches.feed import batch_progress_send
from api.batches.file_selectors import file_get, file_open
from api.batches.file_services import file_create_output
from api.batches.lines import BatchLine, LineError, read_lines
from api.batches.models import Batch, BatchStatus, FilePurpose
from api.batches.objects import batch_object
from api.batches.output import batch_output_lines
from api.batches.selectors import batch_get
from api.common.errors import InvalidRequest, JobNotCancellable, ServiceError
from api.jobs.services.cancel import job_cancel
from api.jobs.services.submission import job_build
from api.models import ACTIVE_STATUSES, ApiKey, Job, JobStatus
from api.webhooks.services import webhook_enqueue
from api.webhooks.targets import webhook_url_check
from inference_service.celery import app as celery_app

logger = logging.getLogger(__name__)

START_BATCH_TASK = "api.tasks.start_batch"
COMPLETION_WINDOWS = {"24h": dt.timedelta(hours=24)}
REPORTED_ERRORS = 100
_JOB_CHUNK = 500  # jobs inserted per statement while a batch starts


class BatchNotCancellable(ServiceError):
    status_code = 409
    code = "batch_not_cancellable"

    def __init__(self, status: str) -> None:
        super().__init__(f"The batch is already {status} and cannot be cancelled.")


def batch_create(*, owner: User, api_key: ApiKey, input_file_id: str, endpoint: str,
                 completion_window: str, metadata: dict[str, str] | None = None, webhook_url: str = "") -> Batch:
    """A new batch of the owner's input file, ``validating`` until the start task reads it.
    Raises FileNotFound for a file that is not the owner's, InvalidRequest for another purpose,
    WebhookUrlRefused for a webhook URL the service may not call."""
    if webhook_url:
        webhook_url_check(webhook_url)
    file = file_get(file_id=input_file_id, owner=owner, param="input_file_id")
    if file.purpose != FilePurpose.BATCH:
        raise InvalidRequest(f"The file {file.id} is not a batch input (its purpose is {file.purpose}).",
                             param="input_file_id")
    now = timezone.now()
    batch = Batch.objects.create(owner=owner, api_key=api_key, input_file_id=file.id, endpoint=endpoint,
                                 completion_window=completion_window, metadata=metadata, webhook_url=webhook_url,
                                 created_at=now, expires_at=now + COMPLETION_WINDOWS[completion_window])
    transaction.on_commit(partial(_send_start, batch.id))
    return batch


def _send_start(batch_id: str) -> None:
    try:
        celery_app.send_task(START_BATCH_TASK, args=[batch_id])
    except (KombuError, OSError):
        logger.warning("could not send the start of batch %s; beat's tick will start it", batch_id, exc_info=True)


class _LinesRefused(Exception):
    def __init__(self, errors: list[LineError]) -> None:
        super().__init__(f"{len(errors)} lines refused")
        self.errors = errors


def batch_start(*, batch_id: str) -> bool:
    """``validating`` → ``in_progress``: every line of the input becomes a held job of the batch
    (one transaction), or, if any line cannot, the batch fails naming the lines. Returns whether
    the batch started (the caller then feeds its key: api/batches/tasks.py). Does nothing for a batch no
    longer validating."""
    try:
        with transaction.atomic():
            batch = Batch.objects.select_for_update().filter(id=batch_id, status=BatchStatus.VALIDATING).first()
            if batch is None:
                return False
            count = _create_jobs(batch)
            Batch.objects.filter(id=batch.id).update(status=BatchStatus.IN_PROGRESS, in_progress_at=timezone.now(),
                                                     model=_first_model(batch.id))
    except _LinesRefused as exc:
        batch_finalize(batch_id=batch_id, errors=[e.as_openai() for e in exc.errors])
        return False
    logger.info("batch %s started: %s jobs", batch_id, count)
    return True


def _first_model(batch_id: str) -> str:
    """The model a batch reports (OpenAI's batch object has one): its first line's."""
    return Job.objects.filter(batch_id=batch_id).order_by("created_at").values_list("model", flat=True).first() or ""


def _create_jobs(batch: Batch) -> int:
    """Insert a held job per line of the batch's input, in the input's order (their creation
    times); raises _LinesRefused for lines that cannot run."""
    key = batch.api_key
    if key is None or not key.is_active:
        raise _LinesRefused([LineError(None, "The batch's API key was revoked.", code="invalid_api_key")])
    file = batch.owner.files.filter(id=batch.input_file_id).first()
    if file is None:
        raise _LinesRefused([LineError(None, "The input file was deleted.", "input_file_id", "file_not_found")])
    errors: list[LineError] = []
    pending: list[Job] = []
    count = 0
    with file_open(file=file) as handle:
        for line in read_lines(handle):
            job = line if isinstance(line, LineError) else _line_job(batch, key, line)
            if isinstance(job, LineError):
                if len(errors) < REPORTED_ERRORS:
                    errors.append(job)
                continue
            if errors:
                continue  # the batch fails: only the errors matter now
            pending.append(job)
            count += 1
            if len(pending) >= _JOB_CHUNK:
                Job.objects.bulk_create(pending)
                pending = []
    if errors:
        raise _LinesRefused(errors)
    Job.objects.bulk_create(pending)
    return count


def _line_job(batch: Batch, key: ApiKey, line: BatchLine) -> Job | LineError:
    if line.url != batch.endpoint:
        return LineError(line.line, f"url {line.url} is not the batch's endpoint {batch.endpoint}", "url")
    try:
        # Never more urgent than BATCH_JOB_PRIORITY, nor than the key's class or the line asks.
        priority = max(settings.BATCH_JOB_PRIORITY, key.priority, line.request.job.priority or 0)
        job = job_build(owner=batch.owner, api_key=key, request=line.request.job, priority=priority)
    except ServiceError as exc:
        param = f"body.{line.request.max_tokens_param if exc.param == 'max_tokens' else exc.param}"
        return LineError(line.line, exc.message, param if exc.param else "body", exc.code)
    job.batch = batch
    job.custom_id = line.custom_id
    return job


def batch_cancel(*, batch_id: str, owner: User) -> Batch:
    """``validating``/``in_progress`` → ``cancelling``: held jobs end cancelled at once, sent ones
    are cancelled as any job is; the batch ends ``cancelled`` once none runs. Cancelling a
    cancelling or cancelled batch changes nothing; another ended one raises BatchNotCancellable."""
    batch = batch_get(batch_id=batch_id, owner=owner)
    now = timezone.now()
    Batch.objects.filter(id=batch.id, status__in=(BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)).update(
        status=BatchStatus.CANCELLING, cancelling_at=now)
    batch.refresh_from_db()
    if batch.status == BatchStatus.CANCELLING:
        _stop_jobs(batch, held_status=JobStatus.CANCELLED)
    elif batch.status not in (BatchStatus.CANCELLED,):
        raise BatchNotCancellable(batch.status)
    return batch


def _stop_jobs(batch: Batch, *, held_status: JobStatus) -> None:
    """End the batch's held jobs with ``held_status`` and cancel those sent; then ask for its
    progress (it ends once none runs)."""
    now = timezone.now()
    Job.objects.filter(batch=batch, status=JobStatus.QUEUED, dispatch_count=0).update(
        status=held_status, cancel_requested=True, finished_at=now)
    for job_id in Job.objects.filter(batch=batch, status__in=ACTIVE_STATUSES).values_list("id", flat=True):
        try:
            job_cancel(job_id=job_id)
        except JobNotCancellable:
            pass  # it ended meanwhile
    transaction.on_commit(partial(batch_progress_send, api_key_id=batch.api_key_id, batch_id=batch.id))


def batch_advance(*, batch_id: str) -> Batch | None:
    """Move a running batch on: past its window, its jobs stop and it will end ``expired``; with
    its key revoked or deleted, it is cancelled; once none of its jobs is queued or running, it
    ends (:func:`batch_finalize`). Returns the batch as it ended, or None while it goes on."""
    batch = Batch.objects.select_related("api_key").filter(id=batch_id).first()
    if batch is None or batch.status not in (BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING, BatchStatus.CANCELLING):
        return None
    if batch.status == BatchStatus.IN_PROGRESS and (batch.api_key is None or not batch.api_key.is_active):
        # Its key was revoked or deleted: nothing may send its held jobs any more.
        if Batch.objects.filter(id=batch.id, status=BatchStatus.IN_PROGRESS).update(
                status=BatchStatus.CANCELLING, cancelling_at=timezone.now()):
            logger.info("batch %s: its API key was revoked; cancelling it", batch.id)
            _stop_jobs(batch, held_status=JobStatus.CANCELLED)
    elif batch.status == BatchStatus.IN_PROGRESS and batch.expired_at is None and timezone.now() >= batch.expires_at:
        if Batch.objects.filter(id=batch.id, expired_at__isnull=True).update(expired_at=timezone.now()):
            logger.info("batch %s: its completion window ended", batch.id)
            _stop_jobs(batch, held_status=JobStatus.EXPIRED)
    if Job.objects.filter(batch_id=batch.id, status__in=ACTIVE_STATUSES).exists():
        return None
    return batch_finalize(batch_id=batch.id)


def batch_finalize(*, batch_id: str, errors: list[dict[str, Any]] | None = None) -> Batch | None:
    """The one way a batch ends. With ``errors`` (a validating batch whose lines cannot run), it
    ends ``failed``. Else, once none of its jobs runs: ``finalizing``, its output and error files
    written from its jobs' rows, then ``completed``, or ``cancelled`` (it was cancelled) or
    ``expired`` (its window ended). Idempotent: a batch already ended is left as it is (returns
    None), and one left ``finalizing`` by a dead process is finished by the next call."""
    now = timezone.now()
    if errors is not None:
        with transaction.atomic():
            failed = Batch.objects.filter(id=batch_id, status=BatchStatus.VALIDATING).update(
                status=BatchStatus.FAILED, failed_at=now, errors={"object": "list", "data": errors},
                request_counts={"total": 0, "completed": 0, "failed": 0})
            return _ended(batch_id) if failed else None
    Batch.objects.filter(id=batch_id, status=BatchStatus.IN_PROGRESS).update(status=BatchStatus.FINALIZING,
                                                                            finalizing_at=now)
    batch = Batch.objects.select_related("owner").filter(id=batch_id).first()
    if batch is None or batch.status not in (BatchStatus.FINALIZING, BatchStatus.CANCELLING):
        return None
    outcome = (BatchStatus.CANCELLED if batch.cancelling_at is not None
               else BatchStatus.EXPIRED if batch.expired_at is not None else BatchStatus.COMPLETED)
    output, failures = batch_output_lines(batch=batch, outcome=outcome)
    with output.handle, failures.handle, transaction.atomic():
        if not Batch.objects.select_for_update().filter(id=batch.id, status=batch.status).exists():
            return None  # another call ended it meanwhile
        files = {}
        for field, file, name in (("output_file", output, "output"), ("error_file", failures, "errors")):
            if file.lines:
                files[field] = file_create_output(owner=batch.owner, filename=f"{batch.id}_{name}.jsonl",
                                                  content=file.handle, size=file.size, lines=file.lines)
        ended = {BatchStatus.COMPLETED: {"completed_at": now}, BatchStatus.CANCELLED: {"cancelled_at": now},
                 BatchStatus.EXPIRED: {}}[outcome]  # expired_at is when the window ended
        Batch.objects.filter(id=batch.id).update(status=outcome, request_counts=_counts(batch.id), **ended, **files)
        return _ended(batch.id)


def _counts(batch_id: str) -> dict[str, int]:
    counts = Job.objects.filter(batch_id=batch_id).aggregate(
        total=Count("id"), completed=Count("id", filter=Q(status=JobStatus.COMPLETED)))
    return {"total": counts["total"], "completed": counts["completed"], "failed": counts["total"] - counts["completed"]}


def _ended(batch_id: str) -> Batch:
    """The batch that has just ended, in the caller's transaction; with a webhook URL, its
    ``batch.<status>`` delivery is recorded there too (one per batch: the event id is the batch's)."""
    batch = Batch.objects.select_related("api_key").get(id=batch_id)
    logger.info("batch %s ended %s", batch.id, batch.status)
    if batch.webhook_url and batch.api_key is not None:
        webhook_enqueue(api_key=batch.api_key, url=batch.webhook_url, event_type=f"batch.{batch.status}",
                        event_id=f"batch_{batch.id}", data=batch_object(batch))
    return batch
