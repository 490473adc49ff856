"""The lines of a batch input file, in OpenAI's format: one JSON object per line,
``{"custom_id": "...", "method": "POST", "url": "/v1/chat/completions", "body": {...}}``, where
``body`` is what the online endpoint takes (api/openai_api/requests.py validates it the same way).

:func:`validate_file` checks an upload line by line as it streams past (the file is never held in
memory), so a bad file is refused at once with its first bad lines named. :func:`read_lines` gives
the lines of a stored file to the batch that runs it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from rest_framework import exceptions as drf_exceptions

from api.common.errors import ServiceError
from api.common.exception_handler import validation_summary
from api.common.parsers import parse_json
from api.openai_api.requests import Kind, OpenAIRequest, openai_request

# The endpoints a batch line may name, and the kind of completion each serves.
BATCH_ENDPOINTS = {"/v1/chat/completions": Kind.CHAT, "/v1/completions": Kind.TEXT}
MAX_CUSTOM_ID_CHARS = 255  # Job.custom_id's length
REPORTED_ERRORS = 10  # the bad lines an error names; a client fixes those and uploads again


@dataclass(frozen=True)
class LineError:
    line: int | None  # 1-based, as editors number them; None for what is not one line's fault
    message: str
    param: str | None = None
    code: str = "invalid_request"

    def as_openai(self) -> dict[str, object]:
        """OpenAI's shape of one of a batch's ``errors``."""
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


@dataclass(frozen=True)
class BatchLine:
    line: int
    custom_id: str
    url: str
    request: OpenAIRequest


class InvalidLine(Exception):
    def __init__(self, error: LineError) -> None:
        super().__init__(error.message)
        self.error = error


class FileInvalid(ServiceError):
    """An upload whose lines are not a batch input: names the first bad lines."""

    code = "invalid_file"

    def __init__(self, errors: list[LineError], *, more: bool = False) -> None:
        self.errors = errors
        listed = "; ".join(f"line {e.line}: {e.message}" for e in errors)
        super().__init__(f"The file is not a valid batch input. {listed}{'; and more' if more else ''}.",
                         param="file")


class FileTooLarge(ServiceError):
    status_code = 413
    code = "file_too_large"


def parse_line(raw: bytes, number: int) -> BatchLine:
    """One line of a batch input, validated. Raises InvalidLine naming what is wrong."""
    def bad(message: str, param: str | None = None, code: str = "invalid_request") -> InvalidLine:
        return InvalidLine(LineError(number, message, param, code))

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise bad("not UTF-8 text", code="invalid_json") from None
    try:
        item = parse_json(text)
    except drf_exceptions.ParseError as exc:
        raise bad(str(exc.detail), code="invalid_json") from None
    if not isinstance(item, dict):
        raise bad("a line must be a JSON object", code="invalid_json")
    unknown = sorted(set(item) - {"custom_id", "method", "url", "body"})
    if unknown:
        raise bad(f"unknown field {unknown[0]!r}", unknown[0])
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID_CHARS:
        raise bad(f"custom_id must be a string of 1 to {MAX_CUSTOM_ID_CHARS} characters", "custom_id")
    if item.get("method") != "POST":
        raise bad('method must be "POST"', "method")
    url = item.get("url")
    if url not in BATCH_ENDPOINTS:
        raise bad(f"url must be one of {', '.join(BATCH_ENDPOINTS)}", "url")
    body = item.get("body")
    if not isinstance(body, dict):
        raise bad("body must be a JSON object", "body")
    if body.get("stream"):
        raise bad("body.stream: a batch's responses are not streamed", "body.stream", "unsupported_parameter")
    if url == "/v1/completions" and body.get("echo"):
        raise bad("body.echo is not supported in a batch", "body.echo", "unsupported_parameter")
    try:
        request = openai_request(BATCH_ENDPOINTS[url], body)
    except drf_exceptions.ValidationError as exc:
        message, param, code = validation_summary(exc)
        raise bad(f"body.{message}" if param else message, f"body.{param}" if param else "body", code) from None
    except ServiceError as exc:
        raise bad(f"body: {exc.message}",
                  f"body.{exc.param}" if exc.param else "body", exc.code) from None
    return BatchLine(number, custom_id, url, request)


def numbered_lines(stream: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """The non-blank lines of ``stream`` (a file opened in binary mode) with their 1-based numbers."""
    for number, raw in enumerate(stream, start=1):
        line = raw.strip()
        if line:
            yield number, line


def validate_file(stream: Iterable[bytes], *, max_lines: int) -> int:
    """Check every line of an upload; returns how many requests it holds. Raises FileInvalid
    naming the first bad lines (a repeated custom_id is a bad line), or FileTooLarge past
    ``max_lines``."""
    errors: list[LineError] = []
    more = False
    seen: set[str] = set()
    count = 0
    for number, raw in numbered_lines(stream):
        count += 1
        if count > max_lines:
            raise FileTooLarge(f"The file has more than {max_lines} requests.", param="file")
        try:
            line = parse_line(raw, number)
            if line.custom_id in seen:
                raise InvalidLine(LineError(number, f"custom_id {line.custom_id!r} is not unique", "custom_id",
                                            "duplicate_custom_id"))
            seen.add(line.custom_id)
        except InvalidLine as exc:
            if len(errors) < REPORTED_ERRORS:
                errors.append(exc.error)
            else:
                more = True
    if errors:
        raise FileInvalid(errors, more=more)
    if count == 0:
        raise FileInvalid([LineError(1, "the file has no requests")])
    return count


def read_lines(stream: Iterable[bytes]) -> Iterator[BatchLine | LineError]:
    """The lines of a stored batch input, each validated again (a line that was valid at upload
    may not be now: the model may have changed)."""
    for number, raw in numbered_lines(stream):
        try:
            yield parse_line(raw, number)
        except InvalidLine as exc:
            yield exc.error
