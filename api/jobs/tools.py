"""Tool calling: OpenAI's ``tools``, ``tool_choice`` and ``parallel_tool_calls``, the model's call
format (read off its chat template), and the grammar that forces a call.

The tools go to the chat template (api/serving/tokenization.py). With ``tool_choice`` ``"auto"``
the model may answer text or calls, and the answer is parsed (api/openai_api/tool_calls.py); with
``"required"`` or a named function the job's constraint is a grammar of the format's calls whose
arguments are JSON validating against each function's ``parameters`` (bounded as any schema), at
most :data:`MAX_PARALLEL_CALLS` of them when ``parallel_tool_calls`` allows several.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from typing import Any, cast

from rest_framework import serializers

from api.common.errors import InvalidRequest
from engine_worker.common.grammar import bounded
from engine_worker.common.request import Constraint

MAX_TOOLS = 128
MAX_PARALLEL_CALLS = 4
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}
# Mistral's templates (mistral-common's, and those in its models' tokenizer_config.json) raise for a
# tool call id other than 9 characters; Mistral's API takes only letters and digits.
_MISTRAL_ID = re.compile(r"^[A-Za-z0-9]{9}$")
_ALPHANUMERIC = string.ascii_letters + string.digits

# The formats this service parses and forces, by a marker of each in the chat template.
# ``mistral``: tokenizers v3 to v7 (Mistral 7B v0.3, Nemo, Small 3.1), a JSON array after
# [TOOL_CALLS]; ``mistral_args``: v11 and later (Mistral Small 3.2, Magistral, Devstral), each call
# written [TOOL_CALLS]name[ARGS]{...}.
HERMES, LLAMA3_JSON, MISTRAL, MISTRAL_ARGS = "hermes", "llama3_json", "mistral", "mistral_args"
MISTRAL_FORMATS = (MISTRAL, MISTRAL_ARGS)
_TEMPLATE_MARKERS = ((HERMES, "<tool_call>"), (MISTRAL_ARGS, "[ARGS]"), (MISTRAL, "[TOOL_CALLS]"),
                     (LLAMA3_JSON, "<|python_tag|>"), (LLAMA3_JSON, "ipython"))
# The control tokens a format's calls are written with, where the model's tokenizer has them as
# single tokens (Mistral's tokenizers do).
CALL_TOKENS = {MISTRAL: ("[TOOL_CALLS]",), MISTRAL_ARGS: ("[TOOL_CALLS]", "[ARGS]")}


def tool_format(chat_template: str | None) -> str | None:
    """The tool call format a chat template writes, or None for a template without tools."""
    for name, marker in _TEMPLATE_MARKERS:
        if chat_template and marker in chat_template:
            return name
    return None


def mistral_call_id(key: str) -> str:
    """A tool call id as Mistral's templates take it (9 letters or digits), the same for the same
    ``key`` (a job's call, or an id of another shape that a client sends back)."""
    number = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
    chars = []
    for _ in range(9):
        number, digit = divmod(number, len(_ALPHANUMERIC))
        chars.append(_ALPHANUMERIC[digit])
    return "".join(chars)


def template_messages(messages: list[dict[str, Any]], fmt: str | None) -> list[dict[str, Any]]:
    """``messages`` as the model's chat template takes them. For Mistral, every tool call id (an
    assistant's ``tool_calls``, a tool message's ``tool_call_id``) that is not 9 letters or digits,
    such as OpenAI's ``call_...``, becomes one (:func:`mistral_call_id` of it, so a call and its
    result still match); other formats take the messages as they are."""
    if fmt not in MISTRAL_FORMATS:
        return messages

    def fixed(call_id: Any) -> Any:
        return call_id if not isinstance(call_id, str) or _MISTRAL_ID.match(call_id) else mistral_call_id(call_id)

    out = []
    for message in messages:
        message = dict(message)
        if isinstance(message.get("tool_calls"), list):
            message["tool_calls"] = [{**call, "id": fixed(call.get("id"))} if isinstance(call, dict) else call
                                     for call in message["tool_calls"]]
        if "tool_call_id" in message:
            message["tool_call_id"] = fixed(message["tool_call_id"])
        out.append(message)
    return out


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


def tools_constraint(spec: dict[str, Any] | None, fmt: str | None,
                     tokens: dict[str, int] | None = None) -> Constraint | None:
    """The grammar forcing a call (``required`` or a named function); None when the model may
    answer freely. ``tokens``: the ids of the format's :data:`CALL_TOKENS` that the model's
    tokenizer has as single tokens. Raises InvalidRequest for tools on a model whose template has
    no tool format."""
    if not spec or spec["tool_choice"] == "none":
        return None
    if fmt is None:
        raise InvalidRequest("This model's chat template does not support tools.", param="tools",
                             code="tools_unsupported")
    return None if spec["tool_choice"] == "auto" else tools_grammar(spec, fmt, tokens)


def tools_grammar(spec: dict[str, Any], fmt: str, tokens: dict[str, int] | None = None) -> Constraint:
    """The grammar of the calls ``spec`` allows (all its functions, or the named one), whether or
    not its tool_choice forces them: compiling it checks every function's parameters."""
    choice = spec["tool_choice"]
    functions = [t["function"] for t in spec["tools"]]
    if isinstance(choice, dict):
        functions = [f for f in functions if f["name"] == choice["function"]["name"]]
    several = spec["parallel_tool_calls"] and not isinstance(choice, dict) and fmt != LLAMA3_JSON
    return Constraint("lark", _calls_lark(functions, fmt, several, tokens or {}))


def _token(text: str, tokens: dict[str, int]) -> str:
    """A control token in a grammar: by its id where the tokenizer has it as one token (a grammar's
    text never matches a special token: llguidance keeps them apart), else as text."""
    return f"<[{tokens[text]}]>" if text in tokens else json.dumps(text)


def _calls_lark(functions: list[dict[str, Any]], fmt: str, several: bool, tokens: dict[str, int]) -> str:
    """A Lark grammar (llguidance's) of one call, or 1 to MAX_PARALLEL_CALLS, in format ``fmt``."""
    lines, alternatives = [], []
    args_key = "parameters" if fmt == LLAMA3_JSON else "arguments"
    for i, fn in enumerate(functions):
        schema = cast(dict[str, Any], bounded(fn.get("parameters") or _EMPTY_PARAMETERS))  # a copy of the dict
        if fmt == MISTRAL_ARGS:
            head = f'{_token("[TOOL_CALLS]", tokens)} {json.dumps(fn["name"])} {_token("[ARGS]", tokens)}'
            lines.append(f"call{i}: {head} args{i}")
        else:
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
        # Mistral 7B v0.3's template puts a space before the "[", Nemo's and later ones none.
        lines.append(f'calls_open: {_token("[TOOL_CALLS]", tokens)} " "? "["')
        start = f'calls_open call (", " call){{0,{extra}}} "]"' if extra else 'calls_open call "]"'
    elif fmt == MISTRAL_ARGS:
        start = f"call{{1,{extra + 1}}}"
    else:
        start = "call"
    return "\n".join([f"start: {start}", *lines])
