"""The response bodies and stream chunks of the OpenAI-compatible endpoints, in OpenAI's shapes.

A completion's ``id`` is ``chatcmpl-<job id>`` or ``cmpl-<job id>``: each request is a job of the
service, which ``GET /api/v1/jobs/<job id>`` shows too (the ``x-job-id`` header names it).
"""

from __future__ import annotations

from typing import Any

from api.common.errors import ServiceError
from api.jobs.logprobs import chat_logprobs, text_logprobs
from api.openai_api.requests import Kind
from api.openai_api.tool_calls import ToolCallStream, openai_calls, parse_tool_calls


class JobCancelled(ServiceError):
    status_code = 409
    code = "job_cancelled"

    def __init__(self, job_id: str) -> None:
        super().__init__(f"The job {job_id} was cancelled before it finished.")


class JobFailed(ServiceError):
    status_code = 502  # the engine worker failed the job; the request itself was valid
    error_type = "server_error"
    code = "job_failed"

    def __init__(self, job_id: str, reason: str | None) -> None:
        super().__init__(f"The job {job_id} failed: {reason or 'the engine gave no reason'}.")


class JobExpired(ServiceError):
    status_code = 503
    error_type = "server_error"
    code = "job_expired"

    def __init__(self, job_id: str) -> None:
        super().__init__(f"The job {job_id} expired in the queue: no engine worker took it in time.")

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "5"}


class StreamRestarted(ServiceError):
    status_code = 503
    error_type = "server_error"
    code = "stream_restarted"

    def __init__(self, job_id: str) -> None:
        super().__init__(
            f"The job {job_id} restarted on another engine worker after part of its text was streamed, "
            f"and the new attempt wrote other text; it goes on, and GET /api/v1/jobs/{job_id} will have "
            f"its whole text.")


def completion_id(kind: Kind, job_id: str) -> str:
    return f"{'chatcmpl' if kind is Kind.CHAT else 'cmpl'}-{job_id}"


def ending_error(final: dict[str, Any]) -> ServiceError | None:
    """The error a job's final stands for, or None for a completed job."""
    status, job_id = final["status"], final["job_id"]
    if status == "completed":
        return None
    if status == "cancelled":
        return JobCancelled(job_id)
    if status == "expired":
        return JobExpired(job_id)
    return JobFailed(job_id, final.get("error"))


def usage(final: dict[str, Any]) -> dict[str, Any]:
    counts = final["usage"]
    return {
        "prompt_tokens": counts["prompt_tokens"],
        "completion_tokens": counts["completion_tokens"],
        "total_tokens": counts["total_tokens"],
        "prompt_tokens_details": {"cached_tokens": counts["cached_tokens"]},
    }


def _finish_reason(final: dict[str, Any], calls: list) -> str:
    # A call that ended the answer is "tool_calls"; one cut by max_tokens stays "length".
    return "tool_calls" if calls and final["finish_reason"] == "stop" else final["finish_reason"]


def completion_body(*, kind: Kind, job_id: str, created: int, model: str, text: str,
                    final: dict[str, Any], logprobs: dict[str, Any] | None = None,
                    tool_format: str | None = None) -> dict[str, Any]:
    """The whole answer of a request without ``stream`` (``logprobs``: the choice's, when asked;
    ``tool_format``: the model's call format, when it may call tools)."""
    if kind is Kind.CHAT:
        content, calls = parse_tool_calls(text, tool_format) if tool_format else (text, [])
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = openai_calls(job_id, calls, tool_format)
        choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": logprobs,
                                  "finish_reason": _finish_reason(final, calls)}
    else:
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": final["finish_reason"]}
    return {"id": completion_id(kind, job_id), "object": kind.value, "created": created, "model": model,
            "choices": [choice], "usage": usage(final), "system_fingerprint": None}


class ChunkWriter:
    """The ``data:`` events of one streamed completion."""

    def __init__(self, *, kind: Kind, job_id: str, created: int, model: str, include_usage: bool,
                 tool_format: str | None = None, tools_forced: bool = False) -> None:
        self.kind = kind
        self._job_id = job_id
        self._calls = ToolCallStream(tool_format, tools_forced) if tool_format and kind is Kind.CHAT else None
        self._tool_format = tool_format
        self._head = {"id": completion_id(kind, job_id),
                      "object": "chat.completion.chunk" if kind is Kind.CHAT else "text_completion",
                      "created": created, "model": model, "system_fingerprint": None}
        self._include_usage = include_usage
        self._offset = 0  # characters of text sent: a text completion's text_offset

    def opening(self) -> dict[str, Any] | None:
        """The chunk before any text: a chat stream names the assistant's role first."""
        if self.kind is Kind.CHAT:
            return self._chunk({"role": "assistant", "content": ""}, None)
        return None

    def text(self, text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
        """A chunk of text; ``logprobs``: its tokens' entries (job_logprobs's form), for a request that asks.
        None while the text is held back as a possible tool call."""
        if self._calls is not None:
            text = self._calls.feed(text)
            if not text:
                return None
            logprobs = None  # a held call's tokens cannot be matched to the text sent
        chunk = self._chunk({"content": text} if self.kind is Kind.CHAT else text, None)
        if logprobs is not None:
            chunk["choices"][0]["logprobs"] = (chat_logprobs(logprobs) if self.kind is Kind.CHAT
                                               else text_logprobs(logprobs, text=text, offset=self._offset))
        self._offset += len(text)
        return chunk

    def closing(self, final: dict[str, Any]) -> list[dict[str, Any]]:
        """The chunk with the finish reason, then (``stream_options.include_usage``) the usage."""
        chunks: list[dict[str, Any]] = []
        calls: list[dict[str, str]] = []
        if self._calls is not None:
            content, calls = self._calls.finish()
            if content:
                chunks.append(self._chunk({"content": content}, None))
            for i, call in enumerate(openai_calls(self._job_id, calls, self._tool_format)):
                chunks.append(self._chunk({"tool_calls": [{"index": i, **call}]}, None))
        chunks.append(self._chunk({} if self.kind is Kind.CHAT else "", _finish_reason(final, calls)))
        if self._include_usage:
            chunks.append({**self._head, "choices": [], "usage": usage(final)})
        return chunks

    def _chunk(self, delta: dict[str, Any] | str, finish_reason: str | None) -> dict[str, Any]:
        if self.kind is Kind.CHAT:
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish_reason}
        chunk = {**self._head, "choices": [choice]}
        if self._include_usage:
            chunk["usage"] = None  # as OpenAI: every chunk but the last has usage null
        return chunk
