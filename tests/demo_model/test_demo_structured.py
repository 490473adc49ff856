"""The shipped demo model (demo_model/demo), which `make run` serves and which knows only Python,
answers JSON that validates against each of 20 schemas, and calls a named tool with arguments that
validate: its chat template has the tool format the service reads (Hermes/Qwen), and renders
messages without tools exactly as the plain ChatML it was trained on."""

from __future__ import annotations

import json

import jsonschema
import pytest

from api.jobs.tools import HERMES, tool_format, tools_constraint, tools_spec
from api.openai_api.tool_calls import parse_tool_calls
from demo_model import DEMO_MODEL_DIR
from engine_worker.common.config import SchedulerConfig
from engine_worker.common.request import Constraint, Request
from engine_worker.sched.scheduler import Scheduler
from tests.api.jobs.test_tools import TOOLS, WEATHER
from tests.engine_worker.engine_helpers import final, greedy, run_scheduler
from tests.engine_worker.runner.schemas import SCHEMAS

pytestmark = [
    pytest.mark.skipif(not (DEMO_MODEL_DIR / "model.safetensors").exists(),
                       reason="no trained weights in demo_model/demo yet: train them with "
                              "python -m demo_model.train (docs/models.md)"),
    pytest.mark.timeout(600),
]

CHATML = ("{{ bos_token }}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.fixture(scope="module")
def demo():
    """As the engine worker loads it (on the CPU, dequantized to fp32)."""
    from engine_worker.runner.loader import load_model

    return load_model(str(DEMO_MODEL_DIR))


@pytest.fixture(scope="module")
def scheduler(demo):
    model, tokenizer = demo
    return Scheduler(model, tokenizer, SchedulerConfig(max_num_seqs=64))


def test_the_demo_models_template_reads_tools_and_renders_plain_chat_as_it_was_trained(demo):
    tokenizer = demo[1]
    assert tool_format(tokenizer.chat_template) == HERMES
    chat = [{"role": "system", "content": "Answer in Python."}, {"role": "user", "content": "def add(a, b):"},
            {"role": "assistant", "content": "return a + b"}, {"role": "user", "content": "def sub(a, b):"}]
    assert (tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
            == tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False, chat_template=CHATML))


def test_twenty_schemas_answer_json_that_validates_every_time_on_the_demo_model(scheduler, demo):
    prompt = demo[1].apply_chat_template([{"role": "user", "content": "A user"}], add_generation_prompt=True)
    requests = [Request(f"s{i}", prompt, greedy(400, constraint=Constraint("json_schema", json.dumps(schema))))
                for i, schema in enumerate(SCHEMAS)]
    outputs = run_scheduler(scheduler, {0: requests})
    for i, schema in enumerate(SCHEMAS):
        out = final(outputs[f"s{i}"])
        assert out.finish_reason == "stop", (i, out.output_text)
        jsonschema.validate(json.loads(out.output_text), schema)


def test_the_demo_model_calls_a_named_tool_with_arguments_that_validate(scheduler, demo):
    tokenizer = demo[1]
    spec = tools_spec(TOOLS, {"type": "function", "function": {"name": "get_weather"}}, None)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS,
                                           add_generation_prompt=True)
    request = Request("named", prompt, greedy(300, constraint=tools_constraint(spec, tool_format(tokenizer.chat_template))))
    out = final(run_scheduler(scheduler, {0: [request]})["named"])

    assert out.finish_reason == "stop", out.output_text
    content, calls = parse_tool_calls(out.output_text, HERMES)
    assert content is None and [c["name"] for c in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER)
