"""Request parsing (strict: wrong types and unknown fields are 400s) and response shapes."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from api.common.serializers import (
    RejectUnknownFieldsMixin,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    check_text,
)
from api.jobs.metadata import MetadataField
from api.jobs.structured import ResponseFormatField
from api.models import JobStatus
from api.webhooks.targets import MAX_WEBHOOK_URL_LENGTH

MAX_STOP_SEQUENCES = 4
MAX_STOP_LENGTH = 256
MAX_MESSAGES = 512
MAX_LOGIT_BIAS_ENTRIES = 300
LOGIT_BIAS_LIMIT = 100.0
PENALTY_LIMIT = 2.0
MAX_TOP_LOGPROBS = 20  # engine_worker.runner.logprobs.MAX_TOP_LOGPROBS (the web side does not import mlx)


@extend_schema_field(
    {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": MAX_STOP_SEQUENCES}]}
)
class StopField(serializers.Field):
    """``stop``: one string or a list of up to 4; always stored as a list."""

    default_error_messages = {"invalid": "Must be a string or a list of strings."}

    def to_internal_value(self, data: Any) -> list[str]:
        items = [data] if isinstance(data, str) else data
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            self.fail("invalid")
        if len(items) > MAX_STOP_SEQUENCES:
            raise serializers.ValidationError(f"At most {MAX_STOP_SEQUENCES} stop sequences.")
        for item in items:
            if not item or len(item) > MAX_STOP_LENGTH:
                raise serializers.ValidationError(f"Stop sequences must have 1 to {MAX_STOP_LENGTH} characters.")
            check_text(item)
        return list(items)

    def to_representation(self, value: list[str]) -> list[str]:
        return list(value)


@extend_schema_field({"type": "object", "additionalProperties": {"type": "number", "minimum": -LOGIT_BIAS_LIMIT,
                                                                  "maximum": LOGIT_BIAS_LIMIT},
                     "maxProperties": MAX_LOGIT_BIAS_ENTRIES,
                     "description": "Token id (as a string) -> bias added to its logit, as OpenAI's logit_bias."})
class LogitBiasField(serializers.Field):
    """``logit_bias``: an object of token ids (decimal strings, as JSON keys are) to biases in
    [-100, 100]; stored with the same string keys. Whether each id is in the model's vocabulary is
    checked by the submission (services/submission.py), which knows the model."""

    default_error_messages = {"invalid": "Must be an object mapping token ids to numbers."}
    _bias = StrictFloatField(min_value=-LOGIT_BIAS_LIMIT, max_value=LOGIT_BIAS_LIMIT)

    def to_internal_value(self, data: Any) -> dict[str, float]:
        if not isinstance(data, dict):
            self.fail("invalid")
        if len(data) > MAX_LOGIT_BIAS_ENTRIES:
            raise serializers.ValidationError(f"At most {MAX_LOGIT_BIAS_ENTRIES} token biases.")
        out: dict[str, float] = {}
        for token, bias in data.items():
            if not (isinstance(token, str) and token.isascii() and token.isdigit()) or len(token) > 12:
                raise serializers.ValidationError(f"{str(token)[:40]!r} is not a token id (a non-negative integer).")
            try:
                out[str(int(token))] = self._bias.run_validation(bias)
            except serializers.ValidationError as exc:
                detail = exc.detail[0] if isinstance(exc.detail, list) else exc.detail
                raise serializers.ValidationError(f"The bias of token {token}: {detail}") from None
        return out

    def to_representation(self, value: dict[str, float]) -> dict[str, float]:
        return dict(value)


class MessageSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    role = serializers.ChoiceField(choices=["system", "user", "assistant", "tool"])
    content = StrictCharField(allow_blank=True, trim_whitespace=False)
    # Tool calling's history (OpenAI's shapes, checked by api/openai_api/requests.py).
    tool_calls = serializers.JSONField(required=False)
    tool_call_id = StrictCharField(required=False, max_length=128)


class JobCreateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    """Body of POST /api/v1/jobs. Exactly one of ``prompt`` and ``messages``."""

    model = StrictCharField(required=False, max_length=128,
                            help_text="A model of `GET /api/v1/models`; optional when one model is served.")
    prompt = StrictCharField(required=False, trim_whitespace=False)
    messages = serializers.ListField(child=MessageSerializer(), required=False, min_length=1, max_length=MAX_MESSAGES)
    max_tokens = StrictIntegerField(required=False, min_value=1)
    temperature = StrictFloatField(required=False, min_value=0.0, max_value=2.0)
    top_p = StrictFloatField(required=False, min_value=0.0, max_value=1.0)
    top_k = StrictIntegerField(required=False, min_value=0, max_value=1_000_000)
    min_p = StrictFloatField(required=False, min_value=0.0, max_value=1.0)
    repetition_penalty = StrictFloatField(required=False, min_value=0.01, max_value=10.0)
    presence_penalty = StrictFloatField(required=False, min_value=-PENALTY_LIMIT, max_value=PENALTY_LIMIT)
    frequency_penalty = StrictFloatField(required=False, min_value=-PENALTY_LIMIT, max_value=PENALTY_LIMIT)
    logit_bias = LogitBiasField(required=False)
    logprobs = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_TOP_LOGPROBS)
    seed = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=2**63 - 1)
    stop = StopField(required=False)
    priority = StrictIntegerField(required=False, min_value=0, max_value=1000)
    metadata = MetadataField(required=False)
    response_format = ResponseFormatField(required=False)
    # Called when the job ends; where it may point is checked by job_create (api/webhooks/targets.py).
    webhook_url = StrictCharField(
        required=False, max_length=MAX_WEBHOOK_URL_LENGTH, allow_blank=False,
        help_text="An http(s) URL on the public internet, POSTed once when the job ends, signed as the "
                  "Standard Webhooks spec says with the key's webhook secret")

    def validate_prompt(self, value: str) -> str:
        if not value:
            raise serializers.ValidationError("The prompt must not be empty.", code="blank")
        if len(value) > settings.MAX_PROMPT_CHARS:
            raise serializers.ValidationError(f"The prompt is longer than {settings.MAX_PROMPT_CHARS} characters.")
        return value

    def validate_messages(self, value: list[dict[str, str]]) -> list[dict[str, str]]:
        if sum(len(m["content"]) for m in value) > settings.MAX_PROMPT_CHARS:
            raise serializers.ValidationError(f"The messages are longer than {settings.MAX_PROMPT_CHARS} characters.")
        return value

    def validate_max_tokens(self, value: int) -> int:
        if value > settings.MAX_TOKENS_CAP:
            raise serializers.ValidationError(
                f"max_tokens must be at most {settings.MAX_TOKENS_CAP}.", code="max_tokens_too_large"
            )
        return value

    def validate_top_p(self, value: float) -> float:
        if value <= 0.0:
            raise serializers.ValidationError("top_p must be greater than 0.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        has_prompt, has_messages = "prompt" in attrs, "messages" in attrs
        if has_prompt == has_messages:
            raise serializers.ValidationError(
                {"prompt": [serializers.ErrorDetail("Send exactly one of 'prompt' and 'messages'.", code="prompt_xor_messages")]}
            )
        return attrs


JOBS_MAX_PAGE_SIZE = 100


class JobListQuerySerializer(serializers.Serializer):
    """GET /jobs's query. The pagination's own parsing would turn ``page=abc`` into a 404 and
    ignore a bad ``page_size``; here both are bad input, a 400 that names them."""

    status = serializers.ChoiceField(choices=JobStatus.choices, required=False)
    page = serializers.IntegerField(min_value=1, required=False)
    page_size = serializers.IntegerField(min_value=1, max_value=JOBS_MAX_PAGE_SIZE, required=False)


class UsageSerializer(serializers.Serializer):
    prompt_tokens = serializers.IntegerField()
    cached_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    total_tokens = serializers.IntegerField()


class TimingsSerializer(serializers.Serializer):
    created_at = serializers.DateTimeField()
    queued_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    first_token_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    ttft_ms = serializers.FloatField(allow_null=True)
    tokens_per_second = serializers.FloatField(allow_null=True)


class JobSerializer(serializers.Serializer):
    """A job as GET /jobs/<id> shows it (built by api.jobs.selectors.job_detail)."""

    id = serializers.UUIDField()
    object = serializers.CharField(default="job")
    status = serializers.ChoiceField(choices=JobStatus.choices)
    queue_position = serializers.IntegerField(allow_null=True)
    model = serializers.CharField()
    model_served = serializers.BooleanField(
        allow_null=True, help_text="Whether a live worker serves the job's model (false: a queued job waits for one "
                                   "to start; null: unknown, the workers' heartbeats cannot be read). As in the 202.")
    output_text = serializers.CharField(allow_blank=True)
    finish_reason = serializers.CharField(allow_null=True)
    cancel_requested = serializers.BooleanField()
    params = serializers.DictField()
    priority = serializers.IntegerField()
    metadata = serializers.DictField(child=serializers.CharField())
    webhook_url = serializers.CharField(allow_null=True, help_text="Called when the job ends (see Webhooks)")
    response_format = serializers.DictField(allow_null=True)
    logprobs = serializers.ListField(child=serializers.DictField(), allow_null=True)
    usage = UsageSerializer()
    timings = TimingsSerializer()
    worker_id = serializers.CharField(allow_null=True)
    error = serializers.CharField(allow_null=True)


class JobCreatedSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    object = serializers.CharField(default="job")
    status = serializers.ChoiceField(choices=JobStatus.choices)
    queue_position = serializers.IntegerField(allow_null=True)
    model = serializers.CharField()
    model_served = serializers.BooleanField(
        allow_null=True, help_text="Whether a live worker serves the job's model (false: it waits for one to start; "
                                   "null: unknown, the workers' heartbeats cannot be read).")
    created_at = serializers.DateTimeField()


class JobDeletedSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    object = serializers.CharField(default="job.deleted")
    deleted = serializers.BooleanField(default=True)


