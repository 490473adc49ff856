"""The model's tool calls parsed into OpenAI's tool_calls, per format, whole and streamed."""

from __future__ import annotations

import json

import pytest

from api.jobs.tools import HERMES, LLAMA3_JSON, MISTRAL, MISTRAL_ARGS, tool_format
from api.openai_api.tool_calls import ToolCallStream, parse_tool_calls

HERMES_TWO = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
              '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>')


def test_hermes_calls_are_parsed_with_arguments_as_json_strings():
    content, calls = parse_tool_calls("Let me look.\n" + HERMES_TWO, HERMES)

    assert content == "Let me look."
    assert [c["name"] for c in calls] == ["get_weather", "now"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}


@pytest.mark.parametrize("fmt, text, names", [
    (MISTRAL, '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]', ["a", "b"]),
    (MISTRAL, '[TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}}]', ["a"]),
    (MISTRAL_ARGS, '[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b[ARGS]{}', ["a", "b"]),
    (MISTRAL_ARGS, '[TOOL_CALLS]a[CALL_ID]abc123XYZ[ARGS]{"x": 1}', ["a"]),
    (LLAMA3_JSON, '<|python_tag|>{"name": "a", "parameters": {"x": 1}}', ["a"]),
    (LLAMA3_JSON, '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}', ["a", "b"]),
])
def test_mistral_and_llama3_calls_are_parsed(fmt, text, names):
    content, calls = parse_tool_calls(text, fmt)

    assert content is None and [c["name"] for c in calls] == names
    assert json.loads(calls[0]["arguments"]) == {"x": 1}


@pytest.mark.parametrize("fmt, text", [
    (HERMES, "def f(x): return x"),
    (HERMES, "<tool_call>\n{not json\n</tool_call>"),
    (MISTRAL, "[TOOL_CALLS] nope"),
    (MISTRAL_ARGS, '[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b[ARGS]{nope'),
    (MISTRAL_ARGS, "[TOOL_CALLS]a b[ARGS]{}"),
    (LLAMA3_JSON, "The answer is {1}"),
])
def test_text_that_is_not_a_call_stays_text(fmt, text):
    assert parse_tool_calls(text, fmt) == (text, [])


def test_a_stream_sends_content_at_once_and_holds_a_call_back_until_its_end():
    stream = ToolCallStream(HERMES)
    sent = [stream.feed(piece) for piece in ["Let me ", "look.\n<tool", "_call>\n{\"name\": \"now\", ",
                                              "\"arguments\": {}}\n</tool_call>"]]

    assert "".join(sent) == "Let me look.\n"
    assert sent[1] == "look.\n"  # "<tool" may start a call: held
    content, calls = stream.finish()
    assert content is None and calls == [{"name": "now", "arguments": "{}"}]


def test_a_stream_that_never_calls_sends_everything():
    stream = ToolCallStream(HERMES)
    assert stream.feed("a < b") + stream.feed(" <to") + stream.feed("ol") == "a < b "
    assert stream.finish() == ("<tool", [])


def test_the_demo_models_template_is_hermes(tiny_model_path):
    from api.serving.tokenization import PromptTokenizer

    assert tool_format(PromptTokenizer(str(tiny_model_path)).chat_template) == HERMES
    assert tool_format("{{ messages }}") is None


FINAL = {"finish_reason": "stop", "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8,
                                            "cached_tokens": 0}}


def test_a_whole_answer_with_calls_has_tool_calls_and_finish_reason_tool_calls():
    from api.openai_api.requests import Kind
    from api.openai_api.responses import completion_body

    body = completion_body(kind=Kind.CHAT, job_id="j-1", created=0, model="tiny", text=HERMES_TWO, final=FINAL,
                           tool_format=HERMES)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["get_weather", "now"]
    cut = completion_body(kind=Kind.CHAT, job_id="j-1", created=0, model="tiny", text="<tool_call>\n{\"na",
                          final={**FINAL, "finish_reason": "length"}, tool_format=HERMES)
    assert cut["choices"][0]["finish_reason"] == "length"  # a call cut by max_tokens is not a call


def test_a_streamed_answer_sends_content_then_the_calls_as_deltas_then_tool_calls():
    from api.openai_api.requests import Kind
    from api.openai_api.responses import ChunkWriter

    writer = ChunkWriter(kind=Kind.CHAT, job_id="j-1", created=0, model="tiny", include_usage=False,
                         tool_format=HERMES)
    sent = [writer.text(piece) for piece in ["Sure.\n", HERMES_TWO[:20], HERMES_TWO[20:]]]
    assert sent[0]["choices"][0]["delta"] == {"content": "Sure.\n"} and sent[1:] == [None, None]
    closing = writer.closing(FINAL)
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in closing[:-1]]
    assert [(c["index"], c["function"]["name"]) for c in calls] == [(0, "get_weather"), (1, "now")]
    assert closing[-1]["choices"][0]["finish_reason"] == "tool_calls"
