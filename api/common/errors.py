"""Domain exceptions: what services raise, each with its HTTP status, error type and code.

Every error the API returns has the shape ``{"error": {"message", "type", "code", "param"}}``
(OpenAI's, :func:`error_body`). The one place these types, and DRF's own exceptions, become
responses is exception_handler.py, so no view formats an error by hand.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import InterfaceError, OperationalError, connections

logger = logging.getLogger(__name__)


class ServiceError(Exception):
    """Base of the domain errors: an HTTP status, an error type and a machine-readable code."""

    status_code = 400
    error_type = "invalid_request_error"
    code = "invalid_request"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def headers(self) -> dict[str, str]:
        return {}


class InvalidRequest(ServiceError):
    pass


class PromptTooLong(ServiceError):
    code = "context_length_exceeded"

    def __init__(self, *, limit: int, prompt_tokens: int, max_tokens: int | None, param: str) -> None:
        """``max_tokens`` None: the request left it out, and the prompt alone leaves no room."""
        self.limit = limit
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        if max_tokens is None:
            detail = f"the prompt has {prompt_tokens} tokens, which leaves no room for any output."
        else:
            detail = (f"the prompt has {prompt_tokens} tokens and max_tokens is {max_tokens} "
                      f"({prompt_tokens + max_tokens} in total).")
        super().__init__(f"This model's maximum context length is {limit} tokens; {detail}", param=param)


class ChatTemplateMissing(ServiceError):
    """Chat messages for a model whose tokenizer has no chat template (a base model, say)."""

    code = "chat_template_missing"

    def __init__(self, model: str) -> None:
        super().__init__(f"The model {model} has no chat template, so it cannot take messages; "
                         f"send the text as prompt instead.", param="messages")


class MaxTokensTooLarge(ServiceError):
    code = "max_tokens_too_large"

    def __init__(self, *, limit: int, requested: int) -> None:
        self.limit = limit
        self.requested = requested
        super().__init__(f"max_tokens is {requested}; the limit for this key is {limit}.", param="max_tokens")


class IdempotencyKeyReused(ServiceError):
    """The Idempotency-Key was used before with a different request body."""

    status_code = 422
    code = "idempotency_key_reused"

    def __init__(self) -> None:
        super().__init__(
            "This Idempotency-Key was already used with a different request body.", param="Idempotency-Key"
        )


class JobNotFound(ServiceError):
    status_code = 404
    code = "job_not_found"

    def __init__(self, job_id: object) -> None:
        super().__init__(f"No job with id {job_id}.", param="id")


class ModelNotFound(ServiceError):
    status_code = 404
    code = "model_not_found"

    def __init__(self, model: str) -> None:
        self.model = model
        super().__init__(f"The model `{model}` does not exist.", param="model")


class ModelRequired(ServiceError):
    """Several models are served, and the request named none."""

    code = "model_required"

    def __init__(self, *, available: list[str]) -> None:
        self.available = available
        super().__init__(f"Name the model: one of {', '.join(available)}.", param="model")


class ModelNotAllowed(ServiceError):
    """The API key may not use this model (an operator restricted its models)."""

    status_code = 403
    code = "model_not_allowed"

    def __init__(self, model: str) -> None:
        self.model = model
        super().__init__(f"This API key may not use the model `{model}`.", param="model")


class ApiKeyNotFound(ServiceError):
    status_code = 404
    code = "api_key_not_found"

    def __init__(self, key_id: object) -> None:
        super().__init__(f"No API key with id {key_id}.", param="id")


class WorkerNotFound(ServiceError):
    """No live engine worker by that id (its heartbeat expired, or it never ran)."""

    status_code = 404
    code = "worker_not_found"

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        super().__init__(f"No live engine worker with id {worker_id}.", param="worker_id")


class JobNotCancellable(ServiceError):
    status_code = 409
    code = "job_not_cancellable"

    def __init__(self, *, status: str) -> None:
        super().__init__(f"The job is already {status} and cannot be cancelled.")


class JobNotDeletable(ServiceError):
    status_code = 409
    code = "job_not_finished"

    def __init__(self, *, status: str) -> None:
        self.status = status
        super().__init__(f"The job is {status.replace('_', ' ')}: cancel it first, then delete it once it has ended.")


class TokenIdOutOfRange(ServiceError):
    code = "invalid_token_id"

    def __init__(self, *, token_id: int, vocab_size: int, param: str) -> None:
        self.token_id = token_id
        self.vocab_size = vocab_size
        super().__init__(f"{param} names token {token_id}, but the model's token ids are 0 to {vocab_size - 1}.",
                         param=param)


class JobNotRequeueable(ServiceError):
    status_code = 409
    code = "job_not_requeueable"

    def __init__(self, *, status: str) -> None:
        super().__init__(f"A {status} job cannot be requeued.")


class AuthenticationFailed(ServiceError):
    status_code = 401
    code = "invalid_api_key"

    def __init__(self, message: str = "Invalid API key.", *, code: str | None = None) -> None:
        super().__init__(message, code=code)

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": 'Bearer realm="api"'}


class ApiKeyRevoked(AuthenticationFailed):
    code = "revoked_api_key"

    def __init__(self) -> None:
        super().__init__("This API key has been revoked.")


class QuotaExceeded(ServiceError):
    """A per-key quota is used up; retrying after ``retry_after`` seconds may succeed."""

    status_code = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, code: str, limit: int, remaining: int, reset_s: float) -> None:
        super().__init__(message, code=code)
        self.limit = limit
        self.remaining = remaining
        self.reset_s = max(0.0, reset_s)

    @property
    def retry_after(self) -> int:
        return max(1, int(self.reset_s + 0.999))

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after),
                **rate_limit_headers(limit=self.limit, remaining=self.remaining, reset_s=self.reset_s)}


def rate_limit_headers(*, limit: int, remaining: int, reset_s: float) -> dict[str, str]:
    """The ``x-ratelimit-*`` headers of a quota: on a 429, and on an accepted submission for the
    request rate."""
    return {
        "x-ratelimit-limit": str(limit),
        "x-ratelimit-remaining": str(max(0, remaining)),
        "x-ratelimit-reset": f"{reset_s:.0f}s",
    }


class ServiceUnavailable(ServiceError):
    status_code = 503
    error_type = "server_error"
    code = "service_unavailable"


class DatabaseUnavailable(ServiceUnavailable):
    """The database could not serve the request: its connection was lost or refused, the pool had
    none to lend in time, or the server cancelled the statement. Nothing about the request is
    wrong, so the client retries it."""

    def __init__(self) -> None:
        super().__init__("The database is unavailable right now; retry in a moment.")

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"}


# The database errors that say nothing about the request (Django's wrappers of the driver's):
# every door answers them with DatabaseUnavailable, a 503, never a 500.
DATABASE_UNAVAILABLE_ERRORS = (OperationalError, InterfaceError)


def database_unavailable(exc: Exception, where: str) -> DatabaseUnavailable:
    """What a client gets for ``exc``, one of DATABASE_UNAVAILABLE_ERRORS. Django discards the
    failed connection at the end of the request (or of the consumer's call). A lost connection
    seldom comes alone (a server restart, pg_terminate_backend), so the connection pool (DB_POOL)
    checks its idle ones now, and the next requests get live ones."""
    logger.warning("Database unavailable in %s: %s", where, exc)
    for wrapper in connections.all(initialized_only=True):
        pool = getattr(wrapper, "pool", None)  # the PostgreSQL backend's psycopg pool, or None
        if pool is not None:
            pool.check()
    return DatabaseUnavailable()


def error_body(message: str, *, error_type: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "code": code, "param": param}}
