"""Mistral's call formats on a model with Mistral's own chat templates and control tokens
(tests/api/mistral_model.py: templates in the formats of Mistral-7B-Instruct-v0.3,
Mistral-Nemo-Instruct-2407 and tokenizer v11), loaded through mlx-lm: the engine's text of a
``[TOOL_CALLS]`` token parses into calls, and with tool_choice "required" the grammar takes the
calls as the template writes them and forces calls that parse back."""

from __future__ import annotations

import json

import jsonschema
import pytest

from api.jobs.services.submission import JobRequest
from api.jobs.structured import job_constraint
from api.jobs.tools import MISTRAL_FORMATS, tool_format, tools_spec
from api.openai_api.tool_calls import ToolCallStream, parse_tool_calls
from api.serving.catalog import ConfiguredModel
from api.serving.tokenization import PromptTokenizer
from engine_worker.common.config import SchedulerConfig
from engine_worker.common.request import Constraint, Request
from engine_worker.runner.detokenizer import detokenizer_factory
from engine_worker.runner.grammar import ConstrainedRows
from engine_worker.sched.scheduler import Scheduler
from tests.api.mistral_model import TOOL_CALLS_ID, V11
from tests.engine_worker.engine_helpers import final, greedy, run_scheduler

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def mistral_model(mistral_model_path):
    """``(model, tokenizer)`` through ``mlx_lm.load``, as an engine worker loads it."""
    import engine_worker.runner.mlx_core  # noqa: F401  (OpenBLAS before mlx-lm loads mlx)

    from mlx_lm import load

    return load(str(mistral_model_path))


def _forced(model_path, parallel: bool) -> Constraint:
    """The constraint the service gives a chat job with tool_choice "required" on this model."""
    request = JobRequest(messages=ASK, tools=tools_spec(TOOLS, "required", parallel))
    constraint = job_constraint(request, ConfiguredModel("tiny", str(model_path)))
    assert constraint is not None
    return constraint


def _templates_call(prompt_tokenizer: PromptTokenizer) -> str:
    """A call as the model's template writes an assistant's call, less the id it adds (a model
    writes none) and the end of sequence."""
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "abcDEF123", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]}]
    rendered = prompt_tokenizer.decode_tokens(prompt_tokenizer.encode_messages(history))
    call = rendered[rendered.index("[TOOL_CALLS]"):rendered.rindex("</s>")]
    return call.replace(', "id": "abcDEF123"', "").replace("[CALL_ID]abcDEF123", "")


def _format(model_path) -> str:
    fmt = tool_format(PromptTokenizer(str(model_path)).chat_template)
    assert fmt in MISTRAL_FORMATS
    return fmt


def test_the_engines_text_of_the_tool_calls_token_parses_whole_and_streamed(mistral_model, mistral_model_path):
    _, tokenizer = mistral_model
    call = _templates_call(PromptTokenizer(str(mistral_model_path)))
    tokens = tokenizer.encode(call, add_special_tokens=False)
    assert tokens[0] == TOOL_CALLS_ID  # the control token, as the model samples it
    detokenizer = detokenizer_factory(tokenizer)()
    pieces = [detokenizer.add(token) for token in tokens] + [detokenizer.finish()]
    assert "".join(pieces) == call

    expected = [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    fmt = _format(mistral_model_path)
    assert parse_tool_calls("".join(pieces), fmt) == (None, expected)
    stream = ToolCallStream(fmt)
    assert "".join(stream.feed(piece) for piece in pieces) == ""
    assert stream.finish() == (None, expected)


@pytest.mark.parametrize("parallel", [False, True])
def test_the_required_grammar_takes_the_call_as_the_template_writes_it(mistral_model, mistral_model_path, parallel):
    _, tokenizer = mistral_model
    call = _templates_call(PromptTokenizer(str(mistral_model_path)))
    constraint = _forced(mistral_model_path, parallel)

    row = ConstrainedRows(tokenizer, None).row(constraint, None, replay=tokenizer.encode(call, add_special_tokens=False))
    assert row.matcher.is_accepting(), call


def test_required_forces_a_call_in_mistrals_format_that_parses(mistral_model, mistral_model_path):
    model, tokenizer = mistral_model
    constraint = _forced(mistral_model_path, parallel=False)
    prompt = PromptTokenizer(str(mistral_model_path)).encode_messages(ASK, tools=TOOLS)
    request = Request("mistral-required", prompt, greedy(200, constraint=constraint))

    out = final(run_scheduler(Scheduler(model, tokenizer, SchedulerConfig()), {0: [request]})[request.request_id])

    assert out.finish_reason == "stop", out.output_text
    assert out.output_token_ids[0] == TOOL_CALLS_ID
    # In the format the template writes: v11's call by name, the earlier ones' JSON array.
    v11 = mistral_model_path.parent.name.startswith(V11)  # tmp_path_factory's folder of the template
    assert out.output_text.startswith("[TOOL_CALLS]get_weather[ARGS]" if v11 else "[TOOL_CALLS]"), out.output_text
    assert v11 or out.output_text.removeprefix("[TOOL_CALLS]").lstrip(" ").startswith('[{"name": "get_weather", "arguments": ')
    content, calls = parse_tool_calls(out.output_text, _format(mistral_model_path))
    assert content is None and [c["name"] for c in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER)
