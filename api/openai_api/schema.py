"""The OpenAI-compatible completions in the OpenAPI schema (a drf-spectacular postprocessing hook).

Like the job event stream (api/system/schema_hooks.py), they are Channels consumers that the schema
generator cannot see. The request bodies list the fields api/openai_api/requests.py accepts; the
responses are OpenAI's shapes (api/openai_api/responses.py).
"""

from __future__ import annotations

from typing import Any

from api.system.schema_hooks import IDEMPOTENCY_KEY_SCHEMA, error_response

_NUMBER = {"type": "number", "nullable": True}
_INTEGER = {"type": "integer", "nullable": True}
_COMMON: dict[str, Any] = {
    "model": {"type": "string", "minLength": 1, "description": "The served model's id (`GET /v1/models`)."},
    "max_tokens": {**_INTEGER, "minimum": 1},
    "temperature": {**_NUMBER, "minimum": 0, "maximum": 2, "default": 1},
    "top_p": {**_NUMBER, "minimum": 0, "exclusiveMinimum": True, "maximum": 1, "default": 1},  # OpenAPI 3.0: a flag
    "n": {**_INTEGER, "enum": [1]},
    "stream": {"type": "boolean", "nullable": True, "default": False},
    "stream_options": {"type": "object", "nullable": True, "additionalProperties": False,
                       "properties": {"include_usage": {"type": "boolean"}}},
    "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 4}],
             "nullable": True},
    "seed": {**_INTEGER, "minimum": 0},
    "presence_penalty": {**_NUMBER, "minimum": -2, "maximum": 2, "default": 0,
                         "description": "Over the last 20 tokens, as mlx-lm applies it."},
    "frequency_penalty": {**_NUMBER, "minimum": -2, "maximum": 2, "default": 0,
                          "description": "Over the last 20 tokens, as mlx-lm applies it."},
    "logit_bias": {"type": "object", "nullable": True, "maxProperties": 300,
                   "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}},
    "user": {"type": "string", "nullable": True},
    "metadata": {"type": "object", "nullable": True, "maxProperties": 16,
                 "additionalProperties": {"type": "string", "maxLength": 512},
                 "description": "Stored with the request's job (GET /api/v1/jobs/<id>, and its list's filter)."},
    "top_k": {**_INTEGER, "minimum": 0, "description": "Extension: sample from the k most likely tokens."},
    "min_p": {**_NUMBER, "minimum": 0, "maximum": 1, "description": "Extension."},
    "repetition_penalty": {**_NUMBER, "minimum": 0.01, "maximum": 10, "description": "Extension."},
    "priority": {**_INTEGER, "minimum": 0, "description": "Extension: as for POST /api/v1/jobs."},
    "response_format": {"type": "object", "nullable": True, "required": ["type"],
                        "properties": {"type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
                                       "json_schema": {"type": "object", "required": ["name"], "properties": {
                                           "name": {"type": "string"}, "schema": {"type": "object"},
                                           "strict": {"type": "boolean", "nullable": True},
                                           "description": {"type": "string"}}}},
                        "description": "Structured output (docs/structured-output.md): the answer is JSON, "
                                       "valid against json_schema.schema when given."},
}
_TOOL_CALL = {"type": "object", "required": ["function"], "properties": {
    "id": {"type": "string"}, "type": {"type": "string", "enum": ["function"]},
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "arguments": {"type": "string"}}}}}
_CHAT_BODY = {
    "type": "object", "required": ["model", "messages"], "additionalProperties": False,
    "properties": {
        **_COMMON,
        "messages": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["role"], "additionalProperties": False,
            "properties": {"role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
                           "content": {"nullable": True, "oneOf": [{"type": "string"}, {"type": "array", "items": {
                               "type": "object", "required": ["type", "text"],
                               "properties": {"type": {"type": "string", "enum": ["text"]},
                                                                "text": {"type": "string"}}}}]},
                           "tool_calls": {"type": "array", "nullable": True, "items": _TOOL_CALL,
                                          "description": "An assistant message's calls."},
                           "tool_call_id": {"type": "string", "description": "A tool message's call."}}}},
        "max_completion_tokens": {**_INTEGER, "minimum": 1},
        "logprobs": {"type": "boolean", "nullable": True, "default": False,
                     "description": "The choice's (or each chunk's) logprobs.content, per token."},
        "top_logprobs": {**_INTEGER, "minimum": 0, "maximum": 20},
        "tools": {"type": "array", "nullable": True, "maxItems": 128, "items": {
            "type": "object", "required": ["type", "function"], "properties": {
                "type": {"type": "string", "enum": ["function"]},
                "function": {"type": "object", "required": ["name"], "properties": {
                    "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}, "description": {"type": "string"},
                    "parameters": {"type": "object"}, "strict": {"type": "boolean"}}}}}},
        "tool_choice": {"nullable": True, "oneOf": [
            {"type": "string", "enum": ["none", "auto", "required"]},
            {"type": "object", "required": ["type", "function"], "properties": {
                "type": {"type": "string", "enum": ["function"]},
                "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}}]},
        "parallel_tool_calls": {"type": "boolean", "nullable": True, "default": True,
                                "description": "At most 4 calls an answer; false: one."},
    },
}
_TEXT_BODY = {
    "type": "object", "required": ["model", "prompt"], "additionalProperties": False,
    "properties": {
        **_COMMON,
        "max_tokens": {**_INTEGER, "minimum": 1, "default": 16},
        "prompt": {"oneOf": [{"type": "string"},
                             {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1}]},
        "echo": {"type": "boolean", "nullable": True, "default": False},
        "logprobs": {**_INTEGER, "minimum": 0, "maximum": 5,
                     "description": "Not with echo: the choice's (or each chunk's) tokens and their log probabilities."},
    },
}
_STREAM_NOTE = (
    "With `stream`, the response is `text/event-stream`: one `data:` chunk per piece of text in OpenAI's "
    "chunk shape, then the finish reason (and the usage, with `stream_options.include_usage`), then "
    "`data: [DONE]`. A job that does not complete ends the stream with a `data: {\"error\": ...}` event. "
    "Each request is a job of the service (`x-job-id` names it); a client that disconnects cancels it "
    "unless the request had an `Idempotency-Key`.")


def _operation(operation_id: str, summary: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "operationId": operation_id,
        "summary": summary,
        "description": _STREAM_NOTE,
        "tags": ["openai"],
        "security": [{"ApiKey": []}],
        "parameters": [{"in": "header", "name": "Idempotency-Key", "required": False, "schema": IDEMPOTENCY_KEY_SCHEMA,
                        "description": "A retry with the same key follows the same job."}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": {
            "200": {"description": "The completion, or its event stream",
                    "content": {"application/json": {"schema": {"type": "object"}},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            "400": error_response("Invalid request, or an OpenAI feature this service does not support"),
            "401": error_response("Missing, invalid or revoked API key"),
            "404": error_response("Unknown model"),
            "409": error_response("The job was cancelled before it finished"),
            "429": error_response("A quota of the key is used up (see Retry-After)"),
            "502": error_response("The engine failed the job"),
            "503": error_response("The job expired in the queue"),
        },
    }


def add_openai_completions(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """POSTPROCESSING_HOOKS entry."""
    paths = result.setdefault("paths", {})
    paths["/v1/chat/completions"] = {"post": _operation("openai_chat_completions_create", "Chat completion (OpenAI's API)",
                                                        _CHAT_BODY)}
    paths["/v1/completions"] = {"post": _operation("openai_completions_create", "Text completion (OpenAI's API)",
                                                   _TEXT_BODY)}
    result["paths"] = dict(sorted(paths.items()))
    return result
