"""A batch input's lines are checked as OpenAI's and the online endpoints check them."""

from __future__ import annotations

import pytest

from api.batches.lines import FileInvalid, FileTooLarge, parse_line, validate_file
from tests.api.batches.helpers import chat_line, jsonl

pytestmark = pytest.mark.django_db


def _validate(lines: list, max_lines: int = 100) -> int:
    return validate_file(jsonl(lines).splitlines(keepends=True), max_lines=max_lines)


def test_a_valid_file_counts_its_requests_and_skips_blank_lines():
    lines = [chat_line("a"), "", chat_line("b"),
             {"custom_id": "c", "method": "POST", "url": "/v1/completions",
              "body": {"model": "tiny", "prompt": "Once", "max_tokens": 4}}]
    assert _validate(lines) == 3


def test_a_parsed_line_carries_the_online_request():
    body = chat_line("x", temperature=0.5, max_completion_tokens=5)
    del body["body"]["max_tokens"]
    line = parse_line(jsonl([body]).strip(), 7)
    assert (line.line, line.custom_id, line.url) == (7, "x", "/v1/chat/completions")
    assert line.request.job.max_tokens == 5 and line.request.job.sampling["temperature"] == 0.5


def test_a_lines_response_format_reaches_its_job_request():
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}}
    line = parse_line(jsonl([chat_line("x", response_format=response_format)]).strip(), 1)
    assert line.request.job.response_format == response_format


@pytest.mark.parametrize(("line", "reason"), [
    ("{not json", "JSON parse error"),
    ([1, 2], "a line must be a JSON object"),
    ({**chat_line("a"), "custom_id": ""}, "custom_id must be a string"),
    ({**chat_line("a"), "method": "GET"}, 'method must be "POST"'),
    ({**chat_line("a"), "url": "/v1/embeddings"}, "url must be one of"),
    ({**chat_line("a"), "body": "hi"}, "body must be a JSON object"),
    ({**chat_line("a"), "extra": 1}, "unknown field 'extra'"),
    (chat_line("a", model="gpt-4"), "body: The model `gpt-4` does not exist."),
    (chat_line("a", temperature="hot"), "body.temperature"),
    (chat_line("a", n=2), "body: n: only one choice"),
    (chat_line("a", stream=True), "body.stream"),
    (chat_line("a", response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}),
     "response_format: the schema cannot be used"),
])
def test_a_bad_line_is_refused_with_its_number_and_reason(line, reason):
    with pytest.raises(FileInvalid) as caught:
        _validate([chat_line("ok"), line])
    [error] = caught.value.errors
    assert error.line == 2
    assert reason in error.message
    assert "line 2: " in caught.value.message and caught.value.status_code == 400


def test_a_repeated_custom_id_is_a_bad_line():
    with pytest.raises(FileInvalid) as caught:
        _validate([chat_line("a"), chat_line("b"), chat_line("a")])
    assert [(e.line, e.code) for e in caught.value.errors] == [(3, "duplicate_custom_id")]


def test_the_error_names_the_first_ten_bad_lines_and_says_there_are_more():
    with pytest.raises(FileInvalid) as caught:
        _validate([{**chat_line(str(i)), "method": "GET"} for i in range(15)])
    assert [e.line for e in caught.value.errors] == list(range(1, 11))
    assert caught.value.message.endswith("; and more.")


def test_an_empty_file_and_one_past_the_line_limit_are_refused():
    with pytest.raises(FileInvalid):
        _validate(["", ""])
    with pytest.raises(FileTooLarge):
        _validate([chat_line(str(i)) for i in range(4)], max_lines=3)
