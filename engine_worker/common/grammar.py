"""Structured-output constraints compiled to llguidance grammars (no mlx: the web side validates
with it too, before a job is made).

A :class:`~engine_worker.common.request.Constraint` is a JSON schema or a Lark grammar. It
compiles to llguidance's grammar text once per distinct constraint (an LRU keyed by the
constraint's hash); the runner builds one ``LLMatcher`` per row from that text.

JSON is generated compact (``whitespace_flexible`` off): no free whitespace runs, so a model
cannot spend its tokens on spaces between fields. A schema is bounded before it compiles
(:func:`bounded`), so every answer can end: a string, array, number or object the schema leaves
open gets a default bound. What it then allows still validates against the original schema.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import TYPE_CHECKING, Any, cast

import llguidance

from engine_worker.common.request import Constraint

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

KINDS = ("json_schema", "lark")
# Distinct constraints kept compiled; a schema is a few kB of grammar text.
_CACHE_SIZE = 256
_JSON_DEFAULTS: JsonCompileOptions = {"whitespace_flexible": False}
# Default bounds for what a schema leaves open (OpenAI's strict mode asks a schema to close its
# objects the same way). A model with no bound can write digits or characters forever.
MAX_STRING = 256
MAX_ITEMS = 32
MAX_INTEGER = 10**15 - 1
NUMBER_STEP = 1e-6  # six fractional digits at most
_OPEN_STRING = ("maxLength", "enum", "const", "pattern", "format")

# ``{"type": "json_object"}``: any JSON object, as a bounded Lark grammar (a schema cannot bound
# free keys in llguidance). Three levels deep, 16 members an object or array.
JSON_OBJECT_LARK = r"""
start: obj2
obj2: "{" (pair2 ("," pair2){0,15})? "}"
pair2: KEY ":" value2
value2: obj1 | arr1 | scalar
obj1: "{" (pair1 ("," pair1){0,15})? "}"
pair1: KEY ":" value1
arr1: "[" (value1 ("," value1){0,15})? "]"
value1: obj0 | arr0 | scalar
obj0: "{" (KEY ":" scalar ("," KEY ":" scalar){0,15})? "}"
arr0: "[" (scalar ("," scalar){0,15})? "]"
scalar: STRING | NUMBER | "true" | "false" | "null"
KEY: /"[A-Za-z_][A-Za-z0-9_ -]{0,31}"/
STRING: /"([^"\\\x00-\x1f]|\\["\\\/bfnrt]){0,256}"/
NUMBER: /-?(0|[1-9][0-9]{0,14})(\.[0-9]{1,6})?/
"""


class ConstraintError(ValueError):
    """A constraint that cannot be compiled: malformed, or using a feature llguidance lacks."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def grammar_for(constraint: Constraint) -> str:
    """llguidance's grammar text for ``constraint`` (cached); raises :class:`ConstraintError`."""
    return _compiled(constraint.kind, constraint.text)


@lru_cache(maxsize=_CACHE_SIZE)
def _compiled(kind: str, text: str) -> str:
    if kind == "json_schema":
        try:
            schema = json.loads(text)
        except ValueError as exc:
            raise ConstraintError(f"the schema is not JSON: {exc}") from None
        if not isinstance(schema, dict | bool):
            raise ConstraintError("the schema must be a JSON object")
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                cast(dict[str, Any], bounded(schema)), defaults=_JSON_DEFAULTS)  # bounded copies its shape; a bool schema passes as JSON too
        except ValueError as exc:
            raise ConstraintError(str(exc)) from None
    elif kind == "lark":
        grammar = llguidance.LLMatcher.grammar_from_lark(text)
    else:
        raise ConstraintError(f"unknown constraint kind {kind!r}; expected one of {KINDS}")
    ok, _warnings = _validate(grammar)
    if not ok:
        raise ConstraintError(_warnings)
    return grammar


def _validate(grammar: str) -> tuple[bool, str]:
    """(valid, error) by llguidance's own check, which compiles the grammar without a tokenizer:
    unsupported schema keywords and malformed grammars are caught here, before any row runs."""
    error = llguidance.LLMatcher.validate_grammar(grammar)
    return (not error, error)


def bounded(schema: object) -> object:
    """``schema`` with default bounds wherever it leaves a string, array, number or object open
    (a copy; the original is not changed). Recurses through every subschema."""
    if isinstance(schema, list):
        return [bounded(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k in ("enum", "const", "default", "examples") else _bounded_child(k, v)) for k, v in schema.items()}
    types = out.get("type")
    types = set(types) if isinstance(types, list) else {types}
    if "string" in types and not any(k in out for k in _OPEN_STRING):
        out["maxLength"] = max(MAX_STRING, _int(out.get("minLength")))
    if "array" in types and "maxItems" not in out and out.get("items") is not False:
        out["maxItems"] = max(MAX_ITEMS, _int(out.get("minItems")))
    if types & {"integer", "number"} and "enum" not in out and "const" not in out:
        out.setdefault("maximum", MAX_INTEGER)
        out.setdefault("minimum", -MAX_INTEGER)
        if "number" in types and "multipleOf" not in out:
            out["multipleOf"] = NUMBER_STEP
    if "object" in types and "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


def _bounded_child(key: str, value: object) -> object:
    if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(value, dict):
        return {name: bounded(sub) for name, sub in value.items()}
    return bounded(value) if isinstance(value, dict | list) else value


def check(constraint: Constraint) -> None:
    """Raise :class:`ConstraintError` if ``constraint`` does not compile."""
    grammar_for(constraint)


def cache_info() -> tuple[int, int]:
    """(hits, misses) of the compiled-grammar cache."""
    info = _compiled.cache_info()
    return info.hits, info.misses
