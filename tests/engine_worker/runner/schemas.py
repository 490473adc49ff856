"""Twenty JSON schemas of different shapes (nested objects, arrays, enums, numbers, required
fields), shared by the engine's and the API's structured-output tests."""

from __future__ import annotations

_NAME = {"type": "string", "maxLength": 16}
_AGE = {"type": "integer", "minimum": 0, "maximum": 150}

SCHEMAS: list[dict] = [
    {"type": "object", "properties": {"name": _NAME, "age": _AGE}, "required": ["name", "age"],
     "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"],
     "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": _NAME, "minItems": 1, "maxItems": 3}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -99, "maximum": 99}, "minItems": 2, "maxItems": 5},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"id": _AGE, "email": _NAME},
                                               "required": ["id", "email"], "additionalProperties": False}},
     "required": ["user"], "additionalProperties": False},
    {"type": "object", "properties": {"price": {"type": "number", "minimum": 0, "maximum": 1000}},
     "required": ["price"], "additionalProperties": False},
    {"type": "object", "properties": {"status": {"const": "done"}, "count": _AGE}, "required": ["status", "count"],
     "additionalProperties": False},
    {"type": "object", "properties": {"point": {"type": "array", "prefixItems": [_AGE, _AGE], "items": False,
                                                "minItems": 2}},
     "required": ["point"], "additionalProperties": False},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, _NAME]}},
     "required": ["value"], "additionalProperties": False},
    {"type": "object", "properties": {"note": {"type": ["string", "null"], "maxLength": 12}},
     "required": ["note"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "properties": {"sku": _NAME, "qty": _AGE}, "required": ["sku", "qty"],
        "additionalProperties": False}}}, "required": ["items"], "additionalProperties": False},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
     "required": ["code"], "additionalProperties": False},
    {"type": "object", "properties": {"level": {"type": "integer", "enum": [1, 2, 3]}, "label": _NAME},
     "required": ["level"], "additionalProperties": False},
    {"type": "string", "enum": ["yes", "no", "maybe"]},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
        "c": {"type": "boolean"}}, "required": ["c"], "additionalProperties": False}}, "required": ["b"],
        "additionalProperties": False}}, "required": ["a"], "additionalProperties": False},
    {"$defs": {"pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "name": _NAME},
                       "required": ["kind", "name"], "additionalProperties": False}},
     "type": "object", "properties": {"pets": {"type": "array", "items": {"$ref": "#/$defs/pet"}, "maxItems": 2}},
     "required": ["pets"], "additionalProperties": False},
    {"type": "object", "properties": {"ratio": {"type": "number", "minimum": 0, "maximum": 1},
                                      "flag": {"type": "boolean"}, "name": _NAME},
     "required": ["ratio", "flag", "name"], "additionalProperties": False},
    {"type": "integer", "minimum": 10, "maximum": 20},
    {"type": "object", "properties": {"matrix": {"type": "array", "maxItems": 2, "items": {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 2}}},
     "required": ["matrix"], "additionalProperties": False},
]
