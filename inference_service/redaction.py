"""Secrets kept out of log lines: API keys in URLs, headers and messages.

Clients may send their key as ``?api_key=`` (browsers cannot set headers on a WebSocket or an
``EventSource``), so request paths carry secrets. Every log line goes through
:func:`redact_secrets`: the root handler's :class:`RedactSecretsFilter` (settings.LOGGING) covers
Django's, Channels' and our own loggers, and the access log of daphne, which does not go through
``logging``, is redacted by the daphne launcher (inference_service/daphne_server.py).

Two rules, so a variation of the name or the encoding does not slip through:

* the value of any query or form parameter whose name, percent-decoded, holds ``key``, ``token``,
  ``secret``, ``password`` or ``auth`` in any case (``api_key``, ``API_KEY``, ``api%5Fkey``,
  ``access_token``...), or whose value, percent-decoded, holds one of our secrets;
* anything shaped like one of our secrets (``sk-``, not inside a word, and 16 or more URL-safe characters, the ``-``
  possibly percent-encoded) wherever it appears: a path, a Referer, a header, an error message.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote_plus

REDACTED = "[redacted]"

_SENSITIVE_NAME = re.compile(r"key|token|secret|password|passwd|auth", re.IGNORECASE)
# A parameter in a query string, or one in free text after ``?``, ``&`` or ``;``: its name (with the
# separator and ``=``) and its value, up to the next separator, space, quote or fragment.
_PARAMETER = re.compile(r"(?P<name>[?&;][^=&;?#\s\"'<>]{1,100}=)(?P<value>[^&;#\s\"'<>]+)")
_SECRET = re.compile(r"(?<![A-Za-z0-9_])sk(?:-|%2d)[A-Za-z0-9_\-%]{16,}", re.IGNORECASE)


def redact_secrets(text: str) -> str:
    """``text`` with every API key and every sensitive parameter's value replaced by ``[redacted]``."""
    if "=" in text:
        text = _PARAMETER.sub(_redact_parameter, text)
    return _SECRET.sub(REDACTED, text)


def _redact_parameter(match: re.Match[str]) -> str:
    name = unquote_plus(match["name"][1:-1])
    if _SENSITIVE_NAME.search(name) is None and _SECRET.search(unquote_plus(match["value"])) is None:
        return match[0]
    return f"{match['name']}{REDACTED}"


class RedactSecretsFilter(logging.Filter):
    """A handler filter that rewrites each record's message (and its traceback) through
    :func:`redact_secrets`. On a handler it sees every record the handler writes, those of child
    loggers included; a filter on a logger would miss what propagates to it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_secrets(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_secrets(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_secrets(record.stack_info)
        return True
