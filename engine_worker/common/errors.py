"""Typed engine exceptions.

Two families, kept apart on purpose: a :class:`RequestError` concerns one request (that request
finishes with ``finish_reason="error"`` and the message; every other request keeps going), while an
:class:`EngineFatalError` means the engine itself cannot continue (the worker exits, is restarted
and its jobs are re-dispatched). Callers branch on the type, never on the message text.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every exception the engine raises on purpose."""


class RequestError(EngineError, ValueError):
    """One request cannot run. ``ValueError`` is a base so seed code catching it still works."""

    def __init__(self, message: str, *, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


class DuplicateRequest(RequestError):
    """A request with this id is still known to the engine; the first one is left untouched."""

    def __init__(self, request_id: str) -> None:
        super().__init__(f"Request {request_id} already exists", request_id=request_id)


class PromptTooLong(RequestError):
    """The prompt has more tokens than the model's context."""

    def __init__(self, *, limit: int, length: int, request_id: str | None = None) -> None:
        super().__init__(
            f"prompt has {length} tokens but the model's context is {limit}", request_id=request_id
        )
        self.limit = limit
        self.length = length


class InvalidRequest(RequestError):
    """The request's own settings are invalid (empty prompt, max_tokens <= 0, ...)."""


class TokenizationError(RequestError):
    """The tokenizer failed on this request's prompt."""


class UnsupportedInput(RequestError):
    """The request carries an input this engine does not serve: ``what`` names the request's
    field (``images``, ``videos``, ``pixel_values`` or ``is_multimodal``)."""

    def __init__(self, what: str, *, request_id: str | None = None) -> None:
        super().__init__(f"multimodal input ({what}) is not supported: this engine serves text-only models",
                         request_id=request_id)
        self.what = what


class ExceedsMemoryBudget(RequestError):
    """The request alone needs more memory than the worker's budget holds (its prompt, or its
    prompt and output so far, with the model's weights and a step's working memory)."""

    def __init__(self, *, need: int, budget: int, request_id: str | None = None) -> None:
        super().__init__(
            f"the request needs {need / 2**20:.0f} MiB of device memory, more than the worker's "
            f"memory budget of {budget / 2**20:.0f} MiB", request_id=request_id)
        self.need = need
        self.budget = budget


class EngineClosed(EngineError, RuntimeError):
    """The engine was stopped or closed; it accepts no more requests."""


class EngineFatalError(EngineError, RuntimeError):
    """The engine cannot continue; the process should exit and be restarted."""
