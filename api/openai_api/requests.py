"""The bodies of ``POST /v1/chat/completions`` and ``POST /v1/completions``, as OpenAI defines them,
turned into the service's own job request.

Each body is checked in two steps:

1. its OpenAI shape (these serializers): the fields OpenAI's API takes, with its defaults
   (``temperature`` 1, ``top_p`` 1; ``max_tokens`` 16 for completions), and a 400 that names
   the parameter for any OpenAI feature this service cannot honour (``n`` > 1, log probabilities
   of an echoed prompt). Silently ignoring one would return
   something other than what was asked for. Unknown fields are a 400, as on OpenAI's API;
2. the job it becomes goes through ``JobCreateSerializer``, so every limit of ``POST
   /api/v1/jobs`` (prompt size, the token cap, stop sequences, text validity) applies
   unchanged, and ``job_create`` then checks the context length and the key's quotas.

``top_k``, ``min_p``, ``repetition_penalty`` and ``priority`` are accepted as extensions, as
vLLM's OpenAI server accepts its sampling extras, and so is ``webhook_url`` (as on ``POST
/api/v1/jobs``; the SDKs send it with ``extra_body``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from rest_framework import serializers

from api.common.errors import ServiceError
from api.common.serializers import (
    RejectUnknownFieldsMixin,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
)
from api.jobs.metadata import MetadataField
from api.jobs.serializers import JobCreateSerializer, LogitBiasField, StopField
from api.jobs.services.submission import JobRequest
from api.jobs.structured import ResponseFormatField, response_format_constraint
from api.jobs.tools import tool_format, tools_spec
from api.serving.catalog import model_resolve
from api.serving.tokenization import get_tokenizer

# OpenAI's default for /v1/completions; chat leaves it to the service's DEFAULT_MAX_TOKENS.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
# OpenAI's limits on the alternatives per token: top_logprobs (chat), logprobs (completions).
CHAT_MAX_TOP_LOGPROBS = 20
TEXT_MAX_LOGPROBS = 5
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


class Kind(Enum):
    CHAT = "chat.completion"
    TEXT = "text_completion"


class UnsupportedParameter(ServiceError):
    code = "unsupported_parameter"

    def __init__(self, param: str, detail: str) -> None:
        super().__init__(f"{param}: {detail}", param=param)


@dataclass(frozen=True)
class OpenAIRequest:
    kind: Kind
    model: str
    job: JobRequest
    stream: bool
    include_usage: bool
    echo: str | None  # completions with echo: the prompt, which the text then starts with
    max_tokens_param: str = "max_tokens"  # the name the client gave the token limit
    # With tools the model may call (tool_choice not "none"): the template's call format
    # (api/jobs/tools.py), parsed out of the answer; ``tools_forced``: the grammar forces calls.
    tool_format: str | None = None
    tools_forced: bool = False


class BooleanField(serializers.BooleanField):
    """A JSON boolean only (DRF's would take "yes", 1 or "false")."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StreamOptionsSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    include_usage = BooleanField(required=False)


class _CommonSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    """The fields both endpoints share. ``None`` means "not sent" for every optional field, as
    OpenAI's SDKs send ``null`` for parameters left unset in some versions."""

    model = StrictCharField()
    max_tokens = StrictIntegerField(required=False, allow_null=True)
    temperature = StrictFloatField(required=False, allow_null=True)
    top_p = StrictFloatField(required=False, allow_null=True)
    n = StrictIntegerField(required=False, allow_null=True)
    stream = BooleanField(required=False, allow_null=True)
    stream_options = StreamOptionsSerializer(required=False, allow_null=True)
    stop = StopField(required=False, allow_null=True)
    seed = StrictIntegerField(required=False, allow_null=True)
    # Checked by the job's own serializer: ranges, token ids.
    presence_penalty = StrictFloatField(required=False, allow_null=True)
    frequency_penalty = StrictFloatField(required=False, allow_null=True)
    logit_bias = LogitBiasField(required=False, allow_null=True)
    user = StrictCharField(required=False, allow_null=True, allow_blank=True)
    metadata = MetadataField(required=False, allow_null=True)  # stored with the job, as on POST /api/v1/jobs
    # Extensions (vLLM's names): passed to the job as they are.
    top_k = StrictIntegerField(required=False, allow_null=True)
    min_p = StrictFloatField(required=False, allow_null=True)
    repetition_penalty = StrictFloatField(required=False, allow_null=True)
    priority = StrictIntegerField(required=False, allow_null=True)
    webhook_url = StrictCharField(required=False, allow_null=True)  # this service's: called when the job ends
    # Structured output (api/jobs/structured.py), on both endpoints.
    response_format = ResponseFormatField(required=False, allow_null=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = {name: value for name, value in attrs.items() if value is not None}
        model_resolve(name=attrs["model"])  # a 404 before any other check, as OpenAI's API answers
        if attrs.get("n", 1) != 1:
            raise UnsupportedParameter("n", "only one choice per request (n=1) is supported.")
        # Compiled here (cached for the job's own build): a batch line with a bad schema is refused
        # when its file is checked, as the online request is.
        response_format_constraint(attrs.get("response_format"))
        if "stream_options" in attrs and not attrs.get("stream"):
            raise serializers.ValidationError(
                {"stream_options": ["stream_options is only allowed when stream is true."]})
        return attrs


class ContentField(serializers.Field):
    """A message's content: a string, or a list of text parts (``{"type": "text", "text": …}``),
    joined. Images, audio and files are refused: the service serves text models."""

    def to_internal_value(self, data: Any) -> str:
        if isinstance(data, str):
            return data
        if not isinstance(data, list) or not data:
            raise serializers.ValidationError("Must be a string or a non-empty list of content parts.")
        texts = []
        for part in data:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else None
                raise serializers.ValidationError(
                    f"Only text content parts are supported{f', not {kind!r}' if kind else ''}.",
                    code="unsupported_content")
            if set(part) != {"type", "text"} or not isinstance(part["text"], str):
                raise serializers.ValidationError('A text part is {"type": "text", "text": "<string>"}.')
            texts.append(part["text"])
        return "".join(texts)


class ChatMessageSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    role = serializers.ChoiceField(choices=sorted(_ROLES))
    content = ContentField(required=False, allow_null=True)  # null or absent only for an assistant message with tool_calls
    tool_calls = serializers.JSONField(required=False, allow_null=True)  # an assistant's earlier calls
    tool_call_id = StrictCharField(required=False, max_length=128)  # a tool message's call

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        calls = attrs.get("tool_calls")
        if calls is not None and (attrs["role"] != "assistant" or not _calls_shape(calls)):
            raise serializers.ValidationError({"tool_calls": [
                'Only an assistant message has tool_calls: [{"id", "type": "function", "function": {"name", '
                '"arguments"}}].']})
        if (attrs["role"] == "tool") != ("tool_call_id" in attrs):
            raise serializers.ValidationError({"tool_call_id": ["A tool message, and only one, has tool_call_id."]})
        if attrs.get("content") is None and not calls:
            raise serializers.ValidationError({"content": [serializers.ErrorDetail("This field may not be null.",
                                                                                   code="null")]})
        return attrs


def _calls_shape(calls: Any) -> bool:
    return isinstance(calls, list) and all(
        isinstance(c, dict) and isinstance(c.get("function"), dict) and isinstance(c["function"].get("name"), str)
        and isinstance(c["function"].get("arguments", ""), str) for c in calls)


class ChatCompletionSerializer(_CommonSerializer):
    messages = serializers.ListField(child=ChatMessageSerializer(), min_length=1)
    max_completion_tokens = StrictIntegerField(required=False, allow_null=True)
    logprobs = BooleanField(required=False, allow_null=True)
    top_logprobs = StrictIntegerField(required=False, allow_null=True)
    tools = serializers.JSONField(required=False, allow_null=True)
    tool_choice = serializers.JSONField(required=False, allow_null=True)
    parallel_tool_calls = BooleanField(required=False, allow_null=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        if "max_tokens" in attrs and "max_completion_tokens" in attrs:
            raise serializers.ValidationError(
                {"max_tokens": ["Send max_completion_tokens or max_tokens, not both."]})
        if "top_logprobs" in attrs and not attrs.get("logprobs"):
            raise serializers.ValidationError({"top_logprobs": ["top_logprobs needs logprobs: true."]})
        if attrs.get("logprobs"):
            attrs["job_logprobs"] = _in_range(attrs.get("top_logprobs", 0), "top_logprobs", CHAT_MAX_TOP_LOGPROBS)
        attrs["tools_spec"] = tools_spec(attrs.get("tools"), attrs.get("tool_choice"), attrs.get("parallel_tool_calls"))
        return attrs


class CompletionSerializer(_CommonSerializer):
    prompt = serializers.JSONField()
    echo = BooleanField(required=False, allow_null=True)
    logprobs = StrictIntegerField(required=False, allow_null=True)
    best_of = StrictIntegerField(required=False, allow_null=True)
    suffix = StrictCharField(required=False, allow_null=True)

    def validate_prompt(self, value: Any) -> str:
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if not isinstance(value, str):
            raise UnsupportedParameter(
                "prompt", "must be a string (or a list of one string); token ids and batches of prompts are not supported.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        if "logprobs" in attrs:
            if attrs.get("echo"):
                raise UnsupportedParameter("logprobs", "with echo, OpenAI returns the prompt's log probabilities, "
                                                       "which this service does not compute.")
            attrs["job_logprobs"] = _in_range(attrs["logprobs"], "logprobs", TEXT_MAX_LOGPROBS)
        if attrs.get("best_of", 1) != 1:
            raise UnsupportedParameter("best_of", "only best_of=1 is supported.")
        if "suffix" in attrs:
            raise UnsupportedParameter("suffix", "insertion (a suffix after the completion) is not supported.")
        return attrs


def _in_range(value: int, param: str, limit: int) -> int:
    if not 0 <= value <= limit:
        raise serializers.ValidationError({param: [f"Must be between 0 and {limit}."]})
    return value


_PASSED_THROUGH = ("temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty", "logit_bias",
                   "metadata", "top_k", "min_p", "repetition_penalty", "priority", "webhook_url",
                   "response_format")


def openai_request(kind: Kind, body: Any) -> OpenAIRequest:
    """The validated request of ``body`` (parsed JSON). Raises DRF's ValidationError or a
    ServiceError, which api.common.errors maps to the one error envelope."""
    if not isinstance(body, dict):
        raise ServiceError("The request body must be a JSON object.", code="invalid_request")
    shape = ChatCompletionSerializer if kind is Kind.CHAT else CompletionSerializer
    outer = shape(data=body)
    outer.is_valid(raise_exception=True)
    attrs = outer.validated_data
    job_body: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0}  # OpenAI's defaults
    job_body.update({name: attrs[name] for name in _PASSED_THROUGH if name in attrs})
    if "job_logprobs" in attrs:
        job_body["logprobs"] = attrs["job_logprobs"]
    max_tokens_param = "max_completion_tokens" if "max_completion_tokens" in attrs else "max_tokens"
    if max_tokens_param in attrs:
        job_body["max_tokens"] = attrs[max_tokens_param]
    elif kind is Kind.TEXT:
        job_body["max_tokens"] = COMPLETIONS_DEFAULT_MAX_TOKENS
    if kind is Kind.CHAT:
        job_body["messages"] = [_job_message(m) for m in attrs["messages"]]
    else:
        job_body["prompt"] = attrs["prompt"]
    inner = JobCreateSerializer(data=job_body)
    if not inner.is_valid():
        raise serializers.ValidationError(_renamed(inner.errors, "max_tokens", max_tokens_param))
    job = JobRequest.from_validated({**inner.validated_data, "model": attrs["model"]})
    spec = attrs.get("tools_spec")
    calls_possible = spec is not None and spec["tool_choice"] != "none"
    fmt = tool_format(get_tokenizer(model_resolve(name=attrs["model"]).path).chat_template) if calls_possible else None
    return OpenAIRequest(
        kind=kind,
        model=attrs["model"],
        job=replace(job, tools=spec) if spec else job,
        tool_format=fmt,
        tools_forced=calls_possible and spec["tool_choice"] != "auto",
        stream=attrs.get("stream", False),
        include_usage=attrs.get("stream_options", {}).get("include_usage", False),
        echo=attrs["prompt"] if kind is Kind.TEXT and attrs.get("echo") else None,
        max_tokens_param=max_tokens_param,
    )


def _job_message(message: dict[str, Any]) -> dict[str, Any]:
    out = {"role": _ROLES[message["role"]], "content": message.get("content") or ""}
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    if "tool_call_id" in message:
        out["tool_call_id"] = message["tool_call_id"]
    return out


def _renamed(errors: dict[str, Any], name: str, as_name: str) -> dict[str, Any]:
    """The job serializer's errors, with ``max_tokens`` named as the client sent it."""
    return {as_name if key == name else key: value for key, value in errors.items()}
