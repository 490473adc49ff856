"""A job's ``metadata``: the client's own labels (an order id, a conversation), stored with the job,
returned with it and usable to filter ``GET /jobs``. OpenAI's shape and limits: up to 16 pairs,
keys up to 64 characters, string values up to 512."""

from __future__ import annotations

import re
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from api.common.errors import InvalidRequest

MAX_PAIRS = 16
MAX_KEY_LENGTH = 64
MAX_VALUE_LENGTH = 512
_FILTER_PARAM = re.compile(r"^metadata\[(?P<key>[^\[\]]+)\]$")


@extend_schema_field({"type": "object", "maxProperties": MAX_PAIRS,
                      "additionalProperties": {"type": "string", "maxLength": MAX_VALUE_LENGTH},
                      "description": f"Your own labels: up to {MAX_PAIRS} pairs, keys up to {MAX_KEY_LENGTH} "
                                     f"characters, string values up to {MAX_VALUE_LENGTH}."})
class MetadataField(serializers.Field):
    default_error_messages = {"invalid": "Must be an object of string keys to string values."}

    def to_internal_value(self, data: Any) -> dict[str, str]:
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            self.fail("invalid")
        if len(data) > MAX_PAIRS:
            raise serializers.ValidationError(f"At most {MAX_PAIRS} metadata pairs.")
        for key, value in data.items():
            problem = pair_problem(key, value)
            if problem:
                raise serializers.ValidationError(problem)
        return dict(data)

    def to_representation(self, value: dict[str, str]) -> dict[str, str]:
        return dict(value)


def pair_problem(key: str, value: str) -> str | None:
    """What is wrong with one metadata pair, or None: the same rules for what is stored and for
    what a filter asks (printable text: no NUL, which PostgreSQL's text refuses)."""
    if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable() or "[" in key or "]" in key:
        return f"Metadata keys must have 1 to {MAX_KEY_LENGTH} printable characters, without brackets."
    if len(value) > MAX_VALUE_LENGTH or not value.isprintable():
        return f"The value of {key!r} must have at most {MAX_VALUE_LENGTH} printable characters."
    return None


def metadata_filters(query: Any) -> dict[str, str]:
    """The ``metadata[<key>]=<value>`` pairs of a list query (all must match). A malformed or
    repeated one is a 400 naming it."""
    filters: dict[str, str] = {}
    for param in query:
        if not param.startswith("metadata"):
            continue
        match = _FILTER_PARAM.match(param)
        values = query.getlist(param)
        if match is None or len(values) != 1:
            raise InvalidRequest("Filter by metadata as metadata[<key>]=<value>, once per key.", param=param)
        problem = pair_problem(match["key"], values[0])
        if problem:
            raise InvalidRequest(problem, param=param)
        filters[match["key"]] = values[0]
    return filters
