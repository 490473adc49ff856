"""inference_service.redaction: no API key in a log line, whatever the door, the parameter's
spelling or where in the line it sits."""

from __future__ import annotations

import logging
import sys

import pytest

from inference_service.redaction import REDACTED, RedactSecretsFilter, redact_secrets

SECRET = "sk-afXHV-sZOn1XSZn41Wf0xsRYHRCwIm69gnUYj5WoU3I"


@pytest.mark.parametrize("line", [
    f'"GET /api/v1/jobs/1/events?api_key={SECRET} HTTP/1.1" 200',
    f"/ws/v1/generate?after=3&api_key={SECRET}",
    f"/api/v1/jobs?API_KEY={SECRET}",
    f"/api/v1/jobs?api%5Fkey={SECRET}",
    f"/api/v1/jobs?Api-Key={SECRET}&x=1",
    f"/v1/models?access_token={SECRET}",
    f'"https://app.example/page?q={SECRET}#top" "Mozilla/5.0"',  # a Referer, under any name
    f"Authorization: Bearer {SECRET}",
    f"/api/v1/jobs/{SECRET}/",  # a key pasted into the path
    f"key sk%2D{SECRET[3:]} percent-encoded",
    f"/api/v1/jobs?a=%73%6B-{SECRET[3:]}",  # a value percent-encoded, under any name
])
def test_a_key_is_redacted_wherever_it_sits_in_the_line(line):
    redacted = redact_secrets(line)

    assert SECRET[3:] not in redacted and REDACTED in redacted


@pytest.mark.parametrize("line", [
    "/api/v1/jobs?status=completed&metadata[order]=A-17&after=3",
    "GET /api/v1/jobs/4f8a1d2e-0000-0000-0000-000000000000 HTTP/1.1",
    "the task-queue-dispatcher asked for more work",
    "a=1 skip=2",
])
def test_lines_without_secrets_are_left_alone(line):
    assert redact_secrets(line) == line


def test_the_filter_redacts_the_message_its_arguments_and_the_traceback():
    try:
        raise ValueError(f"bad url /x?api_key={SECRET}")
    except ValueError:
        record = logging.LogRecord("daphne.server", logging.ERROR, __file__, 1, "Request %s failed for %s",
                                   (f"/x?api_key={SECRET}", SECRET), exc_info=None)
        record.exc_info = sys.exc_info()

    assert RedactSecretsFilter().filter(record) is True
    line = logging.Formatter("%(message)s").format(record)

    assert SECRET[3:] not in line
    assert "Request /x?api_key=[redacted] failed for [redacted]" in line and "ValueError" in line
