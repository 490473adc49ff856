"""Structured output and tool calls through OpenAI's own SDK, end to end: daphne, an engine worker
subprocess with the real tiny model (which knows only Python), Redis and Postgres."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from api.models import Job
from tests.api.factories import make_api_key
from tests.engine_worker.runner.schemas import SCHEMAS
from tests.integration.test_openai_sdk import base_url  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _client(base_url: str) -> openai.OpenAI:  # noqa: F811
    _key, secret = make_api_key()
    return openai.OpenAI(base_url=base_url, api_key=secret, max_retries=0, timeout=120)


def test_response_format_json_schema_answers_validate_through_the_sdk(base_url):  # noqa: F811
    client = _client(base_url)
    for i, schema in enumerate(SCHEMAS[:5]):
        chat = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "data"}], max_tokens=300, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema}})
        assert chat.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(chat.choices[0].message.content), schema)
    text = client.completions.create(model="tiny", prompt="def f(x):", max_tokens=300, temperature=0,
                                     extra_body={"response_format": {"type": "json_object"}})
    assert isinstance(json.loads(text.choices[0].text), dict)
    job = Job.objects.get(id=text.id.split("-", 1)[1])
    assert job.response_format == {"type": "json_object"} and job.constraint["kind"] == "lark"


def test_tool_choice_required_returns_a_parsed_call_streamed_and_not(base_url):  # noqa: F811
    client = _client(base_url)
    chat = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                          max_tokens=200, temperature=0, parallel_tool_calls=False)
    choice = chat.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)

    stream = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                            max_tokens=200, temperature=0, parallel_tool_calls=False, stream=True)
    chunks = [c for c in stream if c.choices]
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert [(d.index, d.function.name) for d in deltas] == [(0, "get_weather")]
    assert deltas[0].id.startswith("call_") and deltas[0].type == "function"
    assert deltas[0].function.arguments == call.function.arguments  # greedy: the same call
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    # The call and its result go back as history; the model answers (freely: tool_choice none).
    follow = client.chat.completions.create(
        model="tiny", max_tokens=8, temperature=0, tools=TOOLS, tool_choice="none",
        messages=[*ASK, choice.message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": call.id, "content": "sunny"}])
    assert follow.choices[0].finish_reason in ("stop", "length") and not follow.choices[0].message.tool_calls
