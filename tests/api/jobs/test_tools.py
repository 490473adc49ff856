"""Forced tool calls (tool_choice "required" or a named function) through the real tiny model:
the grammar api/jobs/tools.py builds makes the demo model, which knows only Python, call the
function with arguments that validate against its parameters, in the format its template reads."""

from __future__ import annotations

import json

import jsonschema
import pytest

from api.jobs.tools import HERMES, tools_constraint, tools_spec
from api.openai_api.tool_calls import parse_tool_calls
from engine_worker.common.config import SchedulerConfig
from engine_worker.common.request import Request
from engine_worker.sched.scheduler import Scheduler
from tests.engine_worker.engine_helpers import final, greedy, run_scheduler

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                            "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "parameters": {
             "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
             "required": ["a", "b"]}}}]


@pytest.fixture(scope="module")
def scheduler(tiny_model):
    model, tokenizer = tiny_model
    return Scheduler(model, tokenizer, SchedulerConfig())


def _answer(scheduler, tokenizer, tool_choice, parallel=None, max_tokens=300) -> tuple[str, str]:
    constraint = tools_constraint(tools_spec(TOOLS, tool_choice, parallel), HERMES)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS,
                                           add_generation_prompt=True)
    request = Request(f"t-{json.dumps(tool_choice)}-{parallel}", prompt, greedy(max_tokens, constraint=constraint))
    out = final(run_scheduler(scheduler, {0: [request]})[request.request_id])
    return out.output_text, out.finish_reason


def test_a_named_function_is_called_with_arguments_that_validate(scheduler, tiny_model):
    text, reason = _answer(scheduler, tiny_model[1], {"type": "function", "function": {"name": "get_weather"}})

    assert reason == "stop", text
    content, calls = parse_tool_calls(text, HERMES)
    assert content is None and [c["name"] for c in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER)


def test_required_calls_one_or_more_of_the_tools_with_valid_arguments(scheduler, tiny_model):
    text, reason = _answer(scheduler, tiny_model[1], "required")

    assert reason == "stop", text
    _, calls = parse_tool_calls(text, HERMES)
    assert 1 <= len(calls) <= 4
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for call in calls:
        jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]])


def test_without_parallel_calls_exactly_one_call_is_made(scheduler, tiny_model):
    text, _ = _answer(scheduler, tiny_model[1], "required", parallel=False)

    assert len(parse_tool_calls(text, HERMES)[1]) == 1


def test_auto_and_none_leave_the_answer_free():
    assert tools_constraint(tools_spec(TOOLS, "auto", None), HERMES) is None
    assert tools_constraint(tools_spec(TOOLS, "none", None), HERMES) is None
