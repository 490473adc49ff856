"""Jobs on the web side: create (validate, tokenize, quota, insert, dispatch on commit), cancel,
requeue. Worker-side transitions (claim, progress, completion) live in job_lifecycle.py.

A job reaches an engine worker as one Celery message, ``api.tasks.run_job`` with its id, on its
model's shared queue or on one of its workers' own queues (api/serving/catalog.py; prefix-affinity
routing chooses, api/services/job_routing.py), sent once the row that says it is queued has
committed. The message is sent by task name: the task runs in the engine workers, and nothing
of theirs is imported here. A send that fails leaves the job queued, and the reconciler
(api/tasks.py) sends it again: the row is the truth, the broker only delivers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import redis
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from api.common import redis_keys
from api.common.errors import (
    AuthenticationFailed,
    IdempotencyKeyReused,
    InvalidRequest,
    JobNotCancellable,
    JobNotFound,
    JobNotRequeueable,
    MaxTokensTooLarge,
    ModelNotAllowed,
    PromptTooLong,
    TokenIdOutOfRange,
)
from api.common.redis_client import get_redis
from api.keys.quotas import RateLimitState, quota_consume_request, quota_gate
from api.models import SAMPLING_DEFAULTS, ApiKey, Job, JobStatus
from api.selectors.jobs import job_queue_position
from api.services.job_deletion import drop_stream
from api.services.job_routing import job_route
from api.serving.catalog import ConfiguredModel, default_model_name, model_queue, model_resolve
from api.serving.tokenization import get_tokenizer
from api.streaming.job_end import stream_job_end
from api.webhooks.job_events import job_webhooks_enqueue
from api.webhooks.targets import webhook_url_check
from inference_service.celery import app as celery_app

logger = logging.getLogger(__name__)

RUN_JOB_TASK = "api.tasks.run_job"
REQUEUEABLE_STATUSES = (JobStatus.FAILED, JobStatus.EXPIRED, JobStatus.CANCELLED)
MAX_IDEMPOTENCY_KEY_LENGTH = 255


@dataclass(frozen=True)
class JobRequest:
    """A validated POST /jobs body (see JobCreateSerializer)."""

    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    model: str | None = None  # None: the only configured model
    max_tokens: int | None = None
    priority: int | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    webhook_url: str = ""

    @classmethod
    def from_validated(cls, data: dict[str, Any]) -> JobRequest:
        data = dict(data)
        return cls(
            prompt=data.pop("prompt", None),
            model=data.pop("model", None),
            messages=[dict(m) for m in data.pop("messages")] if "messages" in data else None,
            max_tokens=data.pop("max_tokens", None),
            priority=data.pop("priority", None),
            metadata=dict(data.pop("metadata", {})),
            webhook_url=data.pop("webhook_url", ""),
            sampling=data,
        )

    def fingerprint(self) -> str:
        body = {
            "prompt": self.prompt,
            "messages": self.messages,
            "max_tokens": self.max_tokens,
            "priority": self.priority,
            "sampling": self.sampling,
            **({"metadata": self.metadata} if self.metadata else {}),  # bodies without it keep their fingerprint
            **({"webhook_url": self.webhook_url} if self.webhook_url else {}),
            **({"model": self.model} if self.model is not None else {}),
        }
        return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


class JobSubmission(NamedTuple):
    """What :func:`job_create` did. For a new job, ``queue_position`` (jobs ahead of it once it
    was queued) and ``rate_limit`` (where the key stands after this request) come with it; for
    an idempotent replay of an earlier job they are None (nothing was inserted or counted)."""

    job: Job
    created: bool
    queue_position: int | None = None
    rate_limit: RateLimitState | None = None


def job_create(
    *, owner: AbstractBaseUser, api_key: ApiKey, request: JobRequest, idempotency_key: str | None = None
) -> JobSubmission:
    """Create a queued job and dispatch it to the engine once the transaction commits.

    ``created`` is False when ``idempotency_key`` names an earlier job with the same body (that
    job is returned; a different body raises IdempotencyKeyReused). Raises
    InvalidRequest/MaxTokensTooLarge/PromptTooLong for requests the engine could not run,
    ModelNotFound/ModelRequired for a model not served here, ModelNotAllowed for one the key may
    not use, QuotaExceeded when a quota of ``api_key`` is used up, WebhookUrlRefused for a webhook
    URL the service may not call, and AuthenticationFailed when the key was deleted while the
    request ran."""
    if idempotency_key is not None:
        _check_idempotency_key(idempotency_key)
        existing = _job_for_idempotency_key(owner=owner, key=idempotency_key, fingerprint=request.fingerprint())
        if existing is not None:
            return JobSubmission(existing, False)

    job = job_build(owner=owner, api_key=api_key, request=request)
    # Known from here on: the job's usage shows its prompt while it waits and runs. (A batch's jobs
    # are charged only once they run, so job_build leaves it to the engine's count.)
    job.prompt_tokens = len(job.prompt_token_ids)
    rate_limit = quota_consume_request(api_key=api_key)
    route = job_route(model=job.model, prompt_token_ids=job.prompt_token_ids)
    job.routed_worker = route.worker_id
    job.idempotency_key = idempotency_key
    job.dispatch_count = 1  # the send on commit; job_dispatch takes it back if the send fails
    try:
        with transaction.atomic():
            job.save(force_insert=True)
            # Locks the key's row and counts this job in: a QuotaExceeded rolls the insert back.
            quota_gate(api_key_id=api_key.id, prompt_tokens=len(job.prompt_token_ids), max_tokens=job.max_tokens,
                       now=job.created_at)
            transaction.on_commit(partial(job_dispatch, job_id=str(job.id), counted=True, queue=route.queue))
    except ApiKey.DoesNotExist:
        # The key was deleted after this request authenticated with it: as for any unknown key.
        raise AuthenticationFailed("Invalid API key.", code="invalid_api_key") from None
    except IntegrityError:
        # Two requests with the same Idempotency-Key raced; the other one inserted first.
        if idempotency_key is None:
            raise
        existing = _job_for_idempotency_key(owner=owner, key=idempotency_key, fingerprint=request.fingerprint())
        if existing is None:
            raise
        return JobSubmission(existing, False)
    return JobSubmission(job, True, job_queue_position(job=job), rate_limit)


def job_build(*, owner: AbstractBaseUser, api_key: ApiKey, request: JobRequest, priority: int | None = None) -> Job:
    """The unsaved job of ``request``: its model resolved, tokenized, its max_tokens set within the
    key's limit and the context. Raises ModelNotFound/ModelRequired/ModelNotAllowed for a model
    the key cannot use here, InvalidRequest/MaxTokensTooLarge/PromptTooLong/TokenIdOutOfRange for
    a request the engine could not run, WebhookUrlRefused for a webhook URL the service may not
    call. No quota is counted. ``priority``: the job's, for jobs the service makes (a batch's);
    else the request's, never more urgent than the key's class."""
    model = model_resolve(name=request.model)
    if api_key.allowed_models and model.name not in api_key.allowed_models:
        raise ModelNotAllowed(model.name)
    if request.webhook_url:
        webhook_url_check(request.webhook_url)
    prompt_token_ids, param = _tokenize(request, model)
    _check_logit_bias(request.sampling.get("logit_bias"), model)
    max_tokens = _max_tokens(request, model, api_key=api_key, prompt_tokens=len(prompt_token_ids), param=param)
    if priority is None:
        # A key's priority class is the most urgent its jobs can be; a request may only ask for less.
        priority = max(api_key.priority, request.priority if request.priority is not None else api_key.priority)
    return Job(
        owner=owner,
        api_key=api_key,
        model=model.name,
        prompt=request.prompt or "",
        messages=request.messages,
        prompt_token_ids=prompt_token_ids,
        params={**SAMPLING_DEFAULTS, **request.sampling, "max_tokens": max_tokens},
        priority=priority,
        metadata=request.metadata,
        webhook_url=request.webhook_url,
        request_fingerprint=request.fingerprint(),
    )


def _max_tokens(request: JobRequest, model: ConfiguredModel, *, api_key: ApiKey, prompt_tokens: int,
                param: str) -> int:
    """The job's max_tokens: the request's, or the default within the key's limit and what the
    context leaves. Raises MaxTokensTooLarge or PromptTooLong for a job the engine could not run."""
    context = get_tokenizer(model.path).info.context_length
    if request.max_tokens is not None:
        max_tokens = request.max_tokens
        if max_tokens > api_key.max_tokens_per_job:
            raise MaxTokensTooLarge(limit=api_key.max_tokens_per_job, requested=max_tokens)
    else:
        room = context - prompt_tokens
        if room < 1:
            raise PromptTooLong(limit=context, prompt_tokens=prompt_tokens, max_tokens=None, param=param)
        max_tokens = min(settings.DEFAULT_MAX_TOKENS, api_key.max_tokens_per_job, room)
    if prompt_tokens + max_tokens > context:
        raise PromptTooLong(limit=context, prompt_tokens=prompt_tokens, max_tokens=max_tokens, param=param)
    return max_tokens


def _check_idempotency_key(key: str) -> None:
    # Printable ASCII only: header bytes reach Django decoded as Latin-1, so a non-ASCII key would
    # be accepted or refused depending on how the client encoded it (UTF-8 yields C1 controls).
    if not key or len(key) > MAX_IDEMPOTENCY_KEY_LENGTH or not (key.isascii() and key.isprintable()):
        raise InvalidRequest(
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} printable ASCII characters.",
            param="Idempotency-Key",
            code="invalid_idempotency_key",
        )


def _job_for_idempotency_key(*, owner: AbstractBaseUser, key: str, fingerprint: str) -> Job | None:
    job = Job.objects.filter(owner=owner, idempotency_key=key).first()
    if job is not None and job.request_fingerprint != fingerprint:
        raise IdempotencyKeyReused()
    return job


def _check_logit_bias(bias: dict[str, float] | None, model: ConfiguredModel) -> None:
    """Every token a ``logit_bias`` names must be one of the model's (the serializer checked the
    shape; only the model knows its vocabulary)."""
    if not bias:
        return
    vocab = get_tokenizer(model.path).info.vocab_size
    unknown = sorted(int(token) for token in bias if int(token) >= vocab)
    if unknown:
        raise TokenIdOutOfRange(token_id=unknown[0], vocab_size=vocab, param="logit_bias")


def _tokenize(request: JobRequest, model: ConfiguredModel) -> tuple[list[int], str]:
    tokenizer = get_tokenizer(model.path)
    if request.messages is not None:
        return tokenizer.encode_messages(request.messages), "messages"
    return tokenizer.encode_prompt(request.prompt or ""), "prompt"


def job_send(job_id: str, *, queue: str | None = None) -> None:
    """Put one ``run_job`` message for ``job_id`` on ``queue``; without one, on the shared queue of
    the job's model (every send but a new job's: a worker that died or stopped must not be sent
    anything). Raises what the broker raises."""
    if queue is None:
        model = Job.objects.filter(id=job_id).values_list("model", flat=True).first()
        queue = model_queue(model or default_model_name())  # a deleted row: its message claims nothing
    celery_app.send_task(RUN_JOB_TASK, args=[str(job_id)], queue=queue)


def job_dispatch(*, job_id: str, counted: bool = False, queue: str | None = None) -> bool:
    """Send a queued job to ``queue`` (default: its model's shared queue) and count the send in its
    ``dispatch_count``. Never raises: with the broker down the job stays queued and the reconciler
    sends it later. Returns whether the message was sent.

    ``counted``: the row's ``dispatch_count`` already includes this send (job_create inserts it
    so, which saves an UPDATE per submission); it is taken back if the send fails."""
    try:
        job_send(job_id, queue=queue)
    except Exception:  # noqa: BLE001 - any broker failure; the DB row is the truth
        logger.warning("Dispatch of job %s failed; the reconciler will retry", job_id, exc_info=True)
        if counted:
            Job.objects.filter(id=job_id, dispatch_count__gt=0).update(dispatch_count=F("dispatch_count") - 1)
        return False
    if not counted:
        Job.objects.filter(id=job_id).update(dispatch_count=F("dispatch_count") + 1)
    return True


def job_cancel(*, job_id: uuid.UUID | str, owner: AbstractBaseUser | None = None) -> Job:
    """Cancel a job. A queued job becomes ``cancelled`` at once and never reaches the engine
    (workers claim only ``queued`` rows). A running job gets ``cancel_requested`` and the workers
    are told on ``engine:cancel``; the worker that holds it aborts it and records the end.
    Cancelling a cancelled job is a no-op; cancelling another finished job raises
    JobNotCancellable. ``owner`` restricts the lookup (None: any job, for operators)."""
    jobs = (Job.objects.filter(id=job_id) if owner is None
            else Job.objects.filter(id=job_id, owner=owner, deleted_at__isnull=True))
    ended_in_queue = False
    # A job can move queued -> in_progress between our two UPDATEs; loop until one of them wins
    # or the job is finished. Each pass is one conditional UPDATE, so there is no lost update.
    for _ in range(3):
        now = timezone.now()
        with transaction.atomic():
            # It never ran: nothing is charged (a finished job's usage is what the engine processed).
            ended_in_queue = bool(jobs.filter(status=JobStatus.QUEUED).update(
                status=JobStatus.CANCELLED, cancel_requested=True, finished_at=now, prompt_tokens=0, cached_tokens=0,
            ))
            if ended_in_queue:
                job_webhooks_enqueue(job_ids=[job_id])
        if ended_in_queue:
            break
        if jobs.filter(status=JobStatus.IN_PROGRESS).update(cancel_requested=True):
            transaction.on_commit(partial(_publish_cancel, str(job_id)))
            break
        job = jobs.first()
        if job is None:
            raise JobNotFound(job_id)
        if job.status == JobStatus.CANCELLED:
            break
        if job.is_finished:
            raise JobNotCancellable(status=job.status)
    job = jobs.first()
    if job is None:
        raise JobNotFound(job_id)
    if ended_in_queue:  # no worker will publish its final: tell its watchers here
        transaction.on_commit(partial(stream_job_end, job=job))
    return job


def _publish_cancel(job_id: str) -> None:
    try:
        get_redis().publish(redis_keys.CANCEL_CHANNEL, json.dumps({"job_id": job_id}))
    except redis.RedisError:
        # The worker also sees cancel_requested on the row when it next checks its jobs.
        logger.warning("Could not publish the cancel of job %s", job_id, exc_info=True)


def job_requeue(*, job_id: uuid.UUID | str) -> Job:
    """Operator action: put a failed, expired or cancelled job back in the queue from scratch
    (output, counts and timings reset) and dispatch it. A job its owner deleted has no prompt
    left and is never requeued. Running jobs are never requeued here: the
    reconciler does that when their worker's lease expires."""
    now = timezone.now()
    # The prompt's ids never change (a deleted job's are gone, and it is not requeued).
    prompt = Job.objects.filter(id=job_id).values_list("prompt_token_ids", flat=True).first()
    updated = Job.objects.filter(id=job_id, status__in=REQUEUEABLE_STATUSES, deleted_at__isnull=True).update(
        status=JobStatus.QUEUED,
        output_text="",
        logprobs=None,
        finish_reason=None,
        error=None,
        prompt_tokens=len(prompt or []),
        cached_tokens=0,
        completion_tokens=0,
        worker_id=None,
        routed_worker=None,
        lease_expires_at=None,
        cancel_requested=False,
        last_seq=0,
        queued_at=now,
        started_at=None,
        first_token_at=None,
        finished_at=None,
    )
    job = Job.objects.filter(id=job_id).first()
    if job is None:
        raise JobNotFound(job_id)
    if not updated:
        raise JobNotRequeueable(status="deleted" if job.deleted_at is not None else job.status)
    transaction.on_commit(partial(_restart, str(job.id)))
    return job


def _restart(job_id: str) -> None:
    # The old run's chunks would replay as this run's: drop them before the new run starts.
    drop_stream(job_id)
    job_dispatch(job_id=job_id)
