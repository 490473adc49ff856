"""``response_format`` (OpenAI's shape) and the constraint it gives a job's engine request.

``{"type": "text"}`` (or none) is free text; ``{"type": "json_object"}`` is any JSON object (a
bounded grammar, :data:`engine_worker.common.grammar.JSON_OBJECT_LARK`); ``{"type":
"json_schema", "json_schema": {"name", "schema", "strict", "description"}}`` is JSON that
validates against ``schema``. The constraint compiles here, at submission, so a schema the engine
could not follow is a 400 naming ``response_format`` before any job is made.
"""

from __future__ import annotations

import json
import re
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from api.common.errors import InvalidRequest
from engine_worker.common.grammar import JSON_OBJECT_LARK, ConstraintError, check
from engine_worker.common.request import Constraint

MAX_SCHEMA_CHARS = 100_000
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_JSON_SCHEMA_KEYS = {"name", "schema", "strict", "description"}


@extend_schema_field({
    "type": "object",
    "description": 'As OpenAI\'s: {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", '
                   '"json_schema": {"name", "schema", "strict"}}.',
    "properties": {"type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
                   "json_schema": {"type": "object"}},
    "required": ["type"],
})
class ResponseFormatField(serializers.Field):
    """``response_format``: checked for shape here; the schema itself compiles in
    :func:`response_format_constraint`."""

    default_error_messages = {"invalid": 'Must be an object with "type": "text", "json_object" or "json_schema".'}

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict) or data.get("type") not in ("text", "json_object", "json_schema"):
            self.fail("invalid")
        kind = data["type"]
        allowed = {"type", "json_schema"} if kind == "json_schema" else {"type"}
        if set(data) - allowed:
            raise serializers.ValidationError(f"Unknown field(s) for type {kind!r}: {sorted(set(data) - allowed)}.")
        if kind != "json_schema":
            return {"type": kind}
        spec = data.get("json_schema")
        if not isinstance(spec, dict):
            raise serializers.ValidationError('"json_schema" must be an object with "name" and "schema".')
        if set(spec) - _JSON_SCHEMA_KEYS:
            raise serializers.ValidationError(f"Unknown json_schema field(s): {sorted(set(spec) - _JSON_SCHEMA_KEYS)}.")
        if not isinstance(spec.get("name"), str) or not _NAME.match(spec["name"]):
            raise serializers.ValidationError("json_schema.name must be 1 to 64 letters, digits, '_' or '-'.")
        schema = spec.get("schema", {})
        if not isinstance(schema, dict):
            raise serializers.ValidationError("json_schema.schema must be a JSON object.")
        if len(json.dumps(schema)) > MAX_SCHEMA_CHARS:
            raise serializers.ValidationError(f"json_schema.schema is longer than {MAX_SCHEMA_CHARS} characters.")
        if not isinstance(spec.get("strict", False), bool | None):
            raise serializers.ValidationError("json_schema.strict must be a boolean.")
        return {"type": kind, "json_schema": dict(spec)}

    def to_representation(self, value: dict[str, Any]) -> dict[str, Any]:
        return dict(value)


def job_constraint(request: Any, model: Any) -> Constraint | None:
    """The constraint of a job request (``JobRequest``) for ``model``: its forced tool call
    (api/jobs/tools.py), else its response_format's; None for free text."""
    if request.tools and request.tools["tool_choice"] != "none":
        from api.jobs.tools import CALL_TOKENS, tool_format, tools_constraint, tools_grammar
        from api.serving.tokenization import get_tokenizer

        tokenizer = get_tokenizer(model.path)
        fmt = tool_format(tokenizer.chat_template)
        tokens = {text: token for text in CALL_TOKENS.get(fmt or "", ())
                  if (token := tokenizer.added_token_id(text)) is not None}
        forced = tools_constraint(request.tools, fmt, tokens)  # raises for a template without tools
        # Compiled even when the model may answer freely: a function's bad parameters are a 400.
        constraint_check(forced or tools_grammar(request.tools, fmt or "", tokens), param="tools")
        if forced is not None:
            return forced
    return response_format_constraint(request.response_format)


def response_format_constraint(response_format: dict[str, Any] | None, *,
                               param: str = "response_format") -> Constraint | None:
    """The engine constraint of a validated ``response_format``; None for free text. Raises
    InvalidRequest naming ``param`` when the schema does not compile (malformed, or a keyword the
    grammar engine does not support)."""
    if not response_format or response_format["type"] == "text":
        return None
    if response_format["type"] == "json_object":
        return Constraint("lark", JSON_OBJECT_LARK)
    schema = response_format["json_schema"].get("schema", {})
    constraint = Constraint("json_schema", json.dumps(schema, sort_keys=True))
    constraint_check(constraint, param=param)
    return constraint


def constraint_check(constraint: Constraint, *, param: str) -> None:
    """Raise InvalidRequest naming ``param`` if ``constraint`` does not compile."""
    try:
        check(constraint)
    except ConstraintError as exc:
        raise InvalidRequest(f"{param}: the schema cannot be used: {exc.reason}", param=param,
                             code="invalid_schema") from None
