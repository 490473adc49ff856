"""A job's submission: validate, tokenize, check the key's quotas, insert the queued row and
dispatch it once the row has committed (dispatch.py). The state changes after that, made by the
engine workers and the reconciler, are lifecycle.py's.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from api.common.errors import (
    AuthenticationFailed,
    IdempotencyKeyReused,
    InvalidRequest,
    MaxTokensTooLarge,
    ModelNotAllowed,
    PromptTooLong,
    TokenIdOutOfRange,
)
from api.jobs.selectors import job_queue_position
from api.jobs.services.dispatch import job_dispatch_counted
from api.jobs.services.queue_routing import Route, job_route, job_route_settled
from api.jobs.structured import job_constraint
from api.jobs.tools import template_messages, tool_format
from api.keys.quotas import RateLimitState, quota_admission, quota_consume_request
from api.models import SAMPLING_DEFAULTS, ApiKey, Job
from api.serving.catalog import ConfiguredModel, model_resolve
from api.serving.tokenization import get_tokenizer
from api.webhooks.targets import webhook_url_check

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
    response_format: dict[str, Any] | None = None
    tools: dict[str, Any] | None = None  # {"tools", "tool_choice", "parallel_tool_calls"} (api/jobs/tools.py)

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
            response_format=data.pop("response_format", None),
            tools=data.pop("tools", None),
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
            **({"response_format": self.response_format} if self.response_format else {}),
            **({"tools": self.tools} if self.tools else {}),
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
    *, owner: User, api_key: ApiKey, request: JobRequest, idempotency_key: str | None = None
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
    job.dispatch_count = 1  # the send on commit; job_dispatch_counted takes it back if the send fails
    try:
        _job_insert(job=job, api_key=api_key, route=route)
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


def _job_insert(*, job: Job, api_key: ApiKey, route: Route) -> None:
    """Insert ``job`` within ``api_key``'s quotas, to be sent to ``route.queue`` once it commits.
    Once the row has committed, or cannot, its route no longer counts as pending."""
    settled = partial(job_route_settled, model=job.model, route=route)
    try:
        with quota_admission(api_key_id=api_key.id, job_id=job.id, prompt_tokens=len(job.prompt_token_ids),
                             max_tokens=job.max_tokens, now=job.created_at):
            job.save(force_insert=True)
            transaction.on_commit(partial(job_dispatch_counted, job_id=str(job.id), precounted=True,
                                          queue=route.queue))
            transaction.on_commit(settled)  # the row counts in the database's loads from here on
    except BaseException:
        settled()
        raise


def job_build(*, owner: User, api_key: ApiKey, request: JobRequest, priority: int | None = None) -> Job:
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
    constraint = job_constraint(request, model)
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
        response_format=request.response_format,
        tools=request.tools,
        constraint={"kind": constraint.kind, "text": constraint.text} if constraint is not None else None,
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


def _job_for_idempotency_key(*, owner: User, key: str, fingerprint: str) -> Job | None:
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
        tools = request.tools["tools"] if request.tools and request.tools["tool_choice"] != "none" else None
        messages = template_messages(request.messages, tool_format(tokenizer.chat_template))
        return tokenizer.encode_messages(messages, tools=tools), "messages"
    return tokenizer.encode_prompt(request.prompt or ""), "prompt"
