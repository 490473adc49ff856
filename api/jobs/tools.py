"""Tool calling: OpenAI's ``tools``, ``tool_choice`` and ``parallel_tool_calls``, the model's call
format (read off its chat template), and the grammar that forces a call.

The tools go to the chat template (api/serving/tokenization.py). With ``tool_choice`` ``"auto"``
the model may answer text or calls, and the answer is parsed (api/openai_api/tool_calls.py); with
``"required"`` or a named function the job's constraint is a grammar of the format's calls whose
arguments are JSON validating against each function's ``parameters`` (bounded as any schema), at
most :data:`MAX_PARALLEL_CALLS` of them when ``parallel_tool_calls`` allows several.
"""

from __future__ import annotations

import json
import re
from typing import Any, cast

from rest_framework import serializers

from api.common.errors import InvalidRequest
from engine_worker.common.grammar import bounded
from engine_worker.common.request import Constraint

MAX_TOOLS = 128
MAX_PARALLEL_CALLS = 4
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}

# The formats this service parses and forces, by a marker of each in the chat template.
HERMES, LLAMA3_JSON, MISTRAL = "hermes", "llama3_json", "mistral"
_TEMPLATE_MARKERS = ((HERMES, "<tool_call>"), (MISTRAL, "[TOOL_CALLS]"), (LLAMA3_JSON, "<|python_tag|>"),
                     (LLAMA3_JSON, "ipython"))


def tool_format(chat_template: str | None) -> str | None:
    """The tool call format a chat template writes, or None for a template without tools."""
    for name, marker in _TEMPLATE_MARKERS:
        if chat_template and marker in chat_template:
            return name
    return None


def _function(tool: Any, index: int) -> dict[str, Any]:
    where = f"tools.{index}"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise serializers.ValidationError({where: ['A tool is {"type": "function", "function": {...}}.']})
    fn = tool["function"]
    unknown = set(fn) - {"name", "description", "parameters", "strict"}
    if unknown or set(tool) - {"type", "function"}:
        raise serializers.ValidationError({where: [f"Unknown field(s): {sorted(unknown or set(tool) - {'type', 'function'})}."]})
    if not isinstance(fn.get("name"), str) or not _NAME.match(fn["name"]):
        raise serializers.ValidationError({f"{where}.function.name": ["1 to 64 letters, digits, '_' or '-'."]})
    if not isinstance(fn.get("parameters", {}), dict):
        raise serializers.ValidationError({f"{where}.function.parameters": ["Must be a JSON schema object."]})
    if not isinstance(fn.get("description", ""), str):
        raise serializers.ValidationError({f"{where}.function.description": ["Must be a string."]})
    return {"type": "function", "function": dict(fn)}


def tools_spec(tools: Any, tool_choice: Any, parallel: Any) -> dict[str, Any] | None:
    """The job's ``tools`` entry from a chat request's fields (None: no tools). Raises DRF's
    ValidationError naming the field."""
    if tools is None and tool_choice is None:
        return None
    if not isinstance(tools, list) or not tools:
        if tool_choice not in (None, "none"):
            raise serializers.ValidationError({"tool_choice": ["tool_choice needs tools."]})
        return None
    if len(tools) > MAX_TOOLS:
        raise serializers.ValidationError({"tools": [f"At most {MAX_TOOLS} tools."]})
    functions = [_function(tool, i) for i, tool in enumerate(tools)]
    names = [f["function"]["name"] for f in functions]
    if len(set(names)) != len(names):
        raise serializers.ValidationError({"tools": ["Function names must be unique."]})
    choice = "auto" if tool_choice is None else tool_choice
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if name not in names:
            raise serializers.ValidationError({"tool_choice": [f"Must name one of the tools: {names}."]})
        choice = {"type": "function", "function": {"name": name}}
    elif choice not in ("none", "auto", "required"):
        raise serializers.ValidationError({"tool_choice": ['Must be "none", "auto", "required" or a named function.']})
    if parallel is not None and not isinstance(parallel, bool):
        raise serializers.ValidationError({"parallel_tool_calls": ["Must be a boolean."]})
    return {"tools": functions, "tool_choice": choice, "parallel_tool_calls": parallel is not False}


def tools_constraint(spec: dict[str, Any] | None, fmt: str | None) -> Constraint | None:
    """The grammar forcing a call (``required`` or a named function); None when the model may
    answer freely. Raises InvalidRequest for tools on a model whose template has no tool format."""
    if not spec or spec["tool_choice"] == "none":
        return None
    if fmt is None:
        raise InvalidRequest("This model's chat template does not support tools.", param="tools",
                             code="tools_unsupported")
    return None if spec["tool_choice"] == "auto" else tools_grammar(spec, fmt)


def tools_grammar(spec: dict[str, Any], fmt: str) -> Constraint:
    """The grammar of the calls ``spec`` allows (all its functions, or the named one), whether or
    not its tool_choice forces them: compiling it checks every function's parameters."""
    choice = spec["tool_choice"]
    functions = [t["function"] for t in spec["tools"]]
    if isinstance(choice, dict):
        functions = [f for f in functions if f["name"] == choice["function"]["name"]]
    several = spec["parallel_tool_calls"] and not isinstance(choice, dict) and fmt != LLAMA3_JSON
    return Constraint("lark", _calls_lark(functions, fmt, several))


def _calls_lark(functions: list[dict[str, Any]], fmt: str, several: bool) -> str:
    """A Lark grammar (llguidance's) of one call, or 1 to MAX_PARALLEL_CALLS, in format ``fmt``."""
    lines, alternatives = [], []
    args_key = "parameters" if fmt == LLAMA3_JSON else "arguments"
    for i, fn in enumerate(functions):
        schema = cast(dict[str, Any], bounded(fn.get("parameters") or _EMPTY_PARAMETERS))  # a copy of the dict
        head = json.dumps(f'{{"name": "{fn["name"]}", "{args_key}": ')
        lines.append(f"call{i}: {head} args{i} \"}}\"")
        lines.append(f"args{i}: %json {json.dumps({**schema, 'x-guidance': {'whitespace_flexible': False}})}")
        alternatives.append(f"call{i}")
    lines.append(f"call: {' | '.join(alternatives)}")
    extra = MAX_PARALLEL_CALLS - 1 if several else 0
    if fmt == HERMES:
        lines.append('wrapped: "<tool_call>\\n" call "\\n</tool_call>"')
        start = f'wrapped ("\\n" wrapped){{0,{extra}}}' if extra else "wrapped"
    elif fmt == MISTRAL:
        start = f'"[TOOL_CALLS][" call (", " call){{0,{extra}}} "]"' if extra else '"[TOOL_CALLS][" call "]"'
    else:
        start = "call"
    return "\n".join([f"start: {start}", *lines])
