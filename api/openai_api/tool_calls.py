"""The model's tool calls, parsed out of its text into OpenAI's ``tool_calls``, whole or streamed.

One small parser per format (api/jobs/tools.py names them by the chat template):

* ``hermes`` (Qwen, Hermes, the demo model): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  any number, possibly after some text;
* ``mistral`` (Mistral 7B v0.3, Nemo): ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``;
* ``mistral_args`` (Mistral Small 3.2, Magistral): ``[TOOL_CALLS]name[ARGS]{...}`` a call;
* ``llama3_json``: the whole answer is ``{"name": ..., "parameters": {...}}`` (after an optional
  ``<|python_tag|>``), calls separated by ``;``.

A call whose JSON does not parse stays text. While streaming, :class:`ToolCallStream` holds back
text that is (or may be the start of) a call and sends the rest as content at once.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from api.jobs.tools import HERMES, LLAMA3_JSON, MISTRAL, MISTRAL_ARGS, MISTRAL_FORMATS, mistral_call_id

_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_MARKERS = {HERMES: "<tool_call>", MISTRAL: "[TOOL_CALLS]", MISTRAL_ARGS: "[TOOL_CALLS]"}
# One call of ``mistral_args``: its name (a [CALL_ID] and id after it, as the template writes
# history, allowed), then its arguments.
_ARGS_CALL = re.compile(r"^\s*([A-Za-z0-9_-]{1,64})(?:\[CALL_ID\][A-Za-z0-9]+)?\[ARGS\](.*)$", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"


def call_id(job_id: str, index: int, fmt: str | None = None) -> str:
    """A stable id for the job's ``index``-th call (the same streamed or not). Mistral's templates
    refuse a history whose ids are not 9 letters or digits, so a Mistral model's calls get such ids."""
    if fmt in MISTRAL_FORMATS:
        return mistral_call_id(f"{job_id}/{index}")
    return f"call_{job_id.replace('-', '')[:24]}_{index}"


def _call(obj: Any, args_key: str) -> dict[str, str] | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", {}))
    return {"name": obj["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def parse_tool_calls(text: str, fmt: str) -> tuple[str | None, list[dict[str, str]]]:
    """(content, calls): the text outside the calls (None if empty) and each call's ``name`` and
    ``arguments`` (a JSON string, as OpenAI sends it)."""
    calls: list[dict[str, str]] = []
    if fmt == HERMES:
        for match in _HERMES_CALL.finditer(text):
            call = _call(_loads(match.group(1)), "arguments")
            if call is None:
                return (text or None), []
            calls.append(call)
        content = _HERMES_CALL.sub("", text).strip()
    elif fmt == MISTRAL:
        head, marker, tail = text.partition(_MARKERS[MISTRAL])
        parsed = _loads(tail) if marker else None
        items = parsed if isinstance(parsed, list) else [parsed] if parsed is not None else []
        calls = [c for c in (_call(item, "arguments") for item in items) if c is not None]
        if len(calls) != len(items) or not calls:
            return (text or None), []
        content = head.strip()
    elif fmt == MISTRAL_ARGS:
        head, *segments = text.split(_MARKERS[MISTRAL_ARGS])
        matches = [_ARGS_CALL.match(segment) for segment in segments]
        calls = [{"name": m.group(1), "arguments": json.dumps(args)} for m in matches
                 if m is not None and isinstance(args := _loads(m.group(2)), dict)]
        if not calls or len(calls) != len(segments):
            return (text or None), []
        content = head.strip()
    elif fmt == LLAMA3_JSON:
        body = text.strip().removeprefix(_PYTHON_TAG).strip()
        parts = [_call(_loads(part), "parameters") for part in body.split(";")] if body.startswith("{") else []
        if not parts or any(c is None for c in parts):
            return (text or None), []
        calls, content = [c for c in parts if c is not None], ""
    else:
        return (text or None), []
    return (content or None), calls


def openai_calls(job_id: str, calls: list[dict[str, str]], fmt: str | None = None) -> list[dict[str, Any]]:
    return [{"id": call_id(job_id, i, fmt), "type": "function", "function": dict(c)} for i, c in enumerate(calls)]


@dataclass
class ToolCallStream:
    """Splits a streamed answer into content to send now and text held back as a possible call.

    ``forced``: the grammar made the whole answer calls, so all of it is held."""

    fmt: str
    forced: bool = False
    _held: str = ""
    _in_call: bool = False
    _sent_any: bool = field(default=False)

    def feed(self, text: str) -> str:
        """The part of ``text`` (after what was held) that is content for sure."""
        buf = self._held + text
        if self.forced or self._in_call:
            self._held = buf
            return ""
        if self.fmt == LLAMA3_JSON:  # a call is the whole answer: its first characters decide
            if self._sent_any:
                return buf
            start = buf.lstrip()
            if start.startswith(("{", _PYTHON_TAG)):
                self._held, self._in_call = buf, True
                return ""
            if not start or _PYTHON_TAG.startswith(start):
                self._held = buf
                return ""
            self._held, self._sent_any = "", True
            return buf
        marker = _MARKERS[self.fmt]
        at = buf.find(marker)
        if at >= 0:
            self._held, self._in_call = buf[at:], True
            return buf[:at]
        keep = next((k for k in range(min(len(marker) - 1, len(buf)), 0, -1) if marker.startswith(buf[-k:])), 0)
        self._held = buf[len(buf) - keep:] if keep else ""
        out = buf[: len(buf) - keep]
        self._sent_any = self._sent_any or bool(out)
        return out

    def finish(self) -> tuple[str | None, list[dict[str, str]]]:
        """(content still held, calls) at the end of the answer."""
        held, self._held = self._held, ""
        if not held:
            return None, []
        return parse_tool_calls(held, self.fmt)
