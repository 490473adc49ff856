"""The JSON parser of the API: DRF's, with a body-size limit and no 500 on pathological input."""

from __future__ import annotations

import codecs
import json
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from rest_framework import exceptions
from rest_framework.parsers import JSONParser


class RequestTooLarge(exceptions.APIException):
    status_code = 413
    default_detail = "Request body too large."
    default_code = "request_too_large"


class StrictJSONParser(JSONParser):
    """Rejects bodies over settings.MAX_REQUEST_BYTES (413), NaN/Infinity, invalid UTF-8 and JSON
    nested too deeply for Python's decoder (400 instead of a RecursionError)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None) -> Any:
        parser_context = parser_context or {}
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        limit = settings.MAX_REQUEST_BYTES
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise RequestTooLarge(f"Request body larger than {limit} bytes.")
        try:
            text = codecs.decode(raw, encoding)
        except ValueError as exc:
            raise exceptions.ParseError(f"JSON parse error - {_short(exc)}") from None
        return parse_json(text)


def parse_json(text: str) -> Any:
    """``text`` as JSON, as every door reads a body or a message: NaN and Infinity, invalid JSON
    and nesting too deep for Python's decoder are a ParseError (code ``invalid_json``), never a
    RecursionError."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise exceptions.ParseError(f"JSON parse error - {_short(exc)}") from None


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _short(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc)[:200]
