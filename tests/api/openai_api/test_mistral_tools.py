"""Tool calling on a model with Mistral's own chat templates and control tokens, through the real
endpoint (/v1/chat/completions) with a stand-in engine worker that publishes the model's text.

The model folders are tests/api/mistral_model.py's: templates in the tool formats of
Mistral-7B-Instruct-v0.3 (tokenizer v3, SentencePiece), Mistral-Nemo-Instruct-2407 (v3, Tekken) and
tokenizer v11 (Mistral Small 3.2, Magistral), over a tokenizer with Mistral's control tokens as
special tokens."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from channels.db import database_sync_to_async

from api.jobs.tools import mistral_call_id
from api.models import Job
from api.serving.tokenization import get_tokenizer
from tests.api.factories import make_api_key
from tests.api.mistral_model import SPECIAL_TOKENS, V11
from tests.api.openai_api.client import Exchange, run_job

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the consumer's DB calls run on other threads
    pytest.mark.usefixtures("consumer_connections_closed", "redis_client", "dispatched"),
]

CHAT = "/v1/chat/completions"
MISTRAL_ID = re.compile(r"^[A-Za-z0-9]{9}$")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(autouse=True)
def _mistral_model(settings, mistral_model_path):
    settings.MODEL_PATH = str(mistral_model_path)


@pytest.fixture
def call_texts(mistral_model_path) -> list[str]:
    """The model's answer as Mistral models write it: the [TOOL_CALLS] control token, then the call."""
    if mistral_model_path.parent.name.startswith(V11):  # tmp_path_factory's folder of the template
        return ["[TOOL_CALLS]", "get_weather[ARGS]", '{"city": "Paris"}']
    return ["[TOOL_CALLS]", ' [{"name": "get_weather", ', '"arguments": {"city": "Paris"}}]']


async def _job_created(owner_id: int) -> Job:
    for _ in range(200):
        job = await database_sync_to_async(Job.objects.filter(owner_id=owner_id).order_by("created_at").last)()
        if job is not None:
            return job
        await asyncio.sleep(0.02)
    raise AssertionError("no job was created")


def _chat(body: dict, texts: list[str]) -> tuple[Job, dict | list]:
    """The job of a chat completion and its answer (the parsed events of a stream)."""
    api_key, secret = make_api_key()

    async def scenario():
        exchange = Exchange(CHAT, {"model": "tiny", **body}, secret=secret)
        await exchange.send()
        job = await _job_created(api_key.owner_id)
        await run_job(str(job.id), texts)
        return job, await exchange.read()

    job, response = asyncio.run(scenario())
    assert response.status == 200, response.body
    answer = response.data_events() if body.get("stream") else response.json()
    return Job.objects.get(id=job.id), answer



def test_the_tools_are_rendered_by_mistrals_template_as_available_tools(mistral_model_path):
    job, answer = _chat({"messages": ASK, "tools": TOOLS}, ["Sunny."])

    prompt = get_tokenizer(str(mistral_model_path)).decode_tokens(job.prompt_token_ids)
    tools_at = prompt.index("[AVAILABLE_TOOLS]")
    assert prompt.index("[/AVAILABLE_TOOLS]") < prompt.index("[INST]") < prompt.index("What is the weather")
    assert json.loads(prompt[tools_at + len("[AVAILABLE_TOOLS]"):prompt.index("[/AVAILABLE_TOOLS]")]) == TOOLS
    # The control tokens are single special tokens of the prompt, not their spelling in text.
    assert SPECIAL_TOKENS.index("[AVAILABLE_TOOLS]") in job.prompt_token_ids
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "Sunny."}


def test_a_call_in_mistrals_format_is_a_tool_call_whose_id_the_template_takes_back(mistral_model_path, call_texts):
    job, answer = _chat({"messages": ASK, "tools": TOOLS}, call_texts)

    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert MISTRAL_ID.match(call["id"]), call["id"]  # Mistral's templates raise for any other id

    # The call and its result go back as history, as an OpenAI client sends them.
    history = [*ASK, choice["message"], {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    follow, again = _chat({"messages": history, "tools": TOOLS}, ["It is sunny."])

    prompt = get_tokenizer(str(mistral_model_path)).decode_tokens(follow.prompt_token_ids)
    assert prompt.count(call["id"]) == 2  # the call's id and its result's
    assert prompt.index("[TOOL_CALLS]") < prompt.index("[TOOL_RESULTS]") < prompt.index("[/TOOL_RESULTS]")
    assert again["choices"][0]["message"]["content"] == "It is sunny."


def test_a_streamed_call_in_mistrals_format_comes_as_one_tool_call_delta(call_texts):
    _, events = _chat({"messages": ASK, "tools": TOOLS, "stream": True}, call_texts)

    chunks = [e for e in events if e != "[DONE]"]
    assert not any(c["choices"][0]["delta"].get("content") for c in chunks)  # the call is never content
    deltas = [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls", [])]
    assert [(d["index"], d["function"]["name"]) for d in deltas] == [(0, "get_weather")]
    assert MISTRAL_ID.match(deltas[0]["id"]) and json.loads(deltas[0]["function"]["arguments"]) == {"city": "Paris"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_history_with_openai_style_call_ids_renders_with_ids_mistrals_template_takes(mistral_model_path):
    openai_id = "call_Xk29fQ81zLmN0pR7sT3uV5wY"
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": openai_id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": openai_id, "content": "sunny"}]

    job, answer = _chat({"messages": history, "tools": TOOLS}, ["It is sunny."])

    prompt = get_tokenizer(str(mistral_model_path)).decode_tokens(job.prompt_token_ids)
    fixed = mistral_call_id(openai_id)
    assert MISTRAL_ID.match(fixed)
    assert prompt.count(fixed) == 2 and openai_id not in prompt  # the call and its result still match
    assert answer["choices"][0]["message"]["content"] == "It is sunny."
    assert job.messages[1]["tool_calls"][0]["id"] == openai_id  # the job keeps what the client sent
