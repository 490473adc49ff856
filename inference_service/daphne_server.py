"""daphne as the service runs it: ``python -m inference_service.daphne_server`` takes daphne's own
command line (``python -m daphne --help``) and serves it with three changes, each through an
extension point daphne or Twisted offers (the CLI's ``server_class``, the ``Server``'s
``action_logger`` and ``ready_callable`` arguments, autobahn's ``setProtocolOptions``, Twisted's
``Factory.protocol`` and ``LineReceiver.lineLengthExceeded``), one protocol option and one default
of the command line:

* **the access log holds no secrets.** daphne writes each request's path with its query string,
  so ``?api_key=`` would reach the log in full; every path goes through
  :func:`inference_service.redaction.redact_secrets` first.
* **an over-long request head is answered, not dropped.** Twisted's HTTP channel closes the
  connection without a word on a line over 16 KiB (a 64 KiB ``Authorization`` header, say) and
  answers a bare 400 when the head's lines add up to more, or number over 500. Here each is
  answered in the API's error envelope: 414 for a request line over the limit, 431 for the
  header fields.
* **a WebSocket closed by the server says why.** autobahn fails a connection (a message over
  daphne's ``--websocket-max-message-size``, 1 MiB by default; a protocol violation) by dropping
  the TCP connection unless told otherwise; told, it sends the close frame (1009 "message too
  big", 1002, 1007) with its reason.
* **a slow reader gets the whole stream.** After the server's close frame (a job's final is
  followed by close 1000) autobahn waits for the client's close frame, and when none comes in time
  it aborts the TCP connection, which throws away all the client has not received yet: the last
  deltas, the final and the close frame itself (the client sees the connection end without a
  close frame). autobahn waits 1 s by default; under load a client's reads lag by more (300
  streams at once on 2 cores: 11 closing handshakes took over 1 s; a client that read nothing for
  6 s lost its last deltas and final). Here it waits ``--ping-timeout`` (30 s by default), as long
  as daphne already waits for a keep-alive pong before it counts a peer as gone.
* **a busy web process is waited for, not hung up on.** A WebSocket's opening handshake ends when
  the application accepts it (the key checked, the job made); daphne gives it
  ``--websocket_connect_timeout`` (its default 5 s, also autobahn's opening-handshake timeout) and
  then drops the TCP connection without an answer. 300 streams and 300 REST jobs at once on 2
  cores (``make run``, SQLite) took longer than that for 31 to 284 of the 300 streams, whose
  clients saw their connection end without a close code. Here the default is ``--ping-timeout``'s
  30 s too, so a stream under load starts late instead of not at all.

The HTTP channel is Twisted's HTTP/1.1 one: daphne negotiates HTTP/2 only on TLS endpoints, which
this service does not use (it runs behind a proxy).
"""

from __future__ import annotations

import json
from typing import Any

from daphne.cli import CommandLineInterface
from daphne.server import Server
from twisted.web import http

from inference_service.redaction import redact_secrets

# Twisted's limits on a request head: one line, and all of its lines together.
HEAD_LIMIT_BYTES = http.HTTPChannel.totalHeadersSize
# How long a WebSocket's opening handshake may take (``--websocket_connect_timeout``, daphne's
# default 5 s), the application's accept included: as long as daphne waits for a keep-alive pong
# (``--ping-timeout``'s default). See the module's docstring.
OPEN_HANDSHAKE_TIMEOUT_S = 30


class RedactedAccessLog:
    """Wraps daphne's action logger (its access log): each entry's path with secrets redacted."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, protocol: str, action: str, details: dict[str, Any]) -> None:
        path = details.get("path")
        if isinstance(path, str):
            details = {**details, "path": redact_secrets(path)}
        self.inner(protocol, action, details)


class HeadLimitedHTTPChannel(http.HTTPChannel):
    """Twisted's HTTP/1.1 channel, answering a request head over the limit with 414 or 431 (and
    the error envelope) where Twisted drops the connection or answers a bare 400."""

    MAX_LENGTH = HEAD_LIMIT_BYTES

    def __init__(self) -> None:
        super().__init__()
        self._head_bytes = 0  # of the request head being read
        self._head_lines = 0
        self._refused = False

    def lineReceived(self, line: bytes) -> None:
        if self._refused:
            return
        self._head_bytes += len(line)
        self._head_lines += 1
        # The request line and maxHeaders header lines at most (Twisted answers a bare 400 beyond).
        if self._head_bytes > self.totalHeadersSize or self._head_lines > self.maxHeaders + 1:
            self._refuse(431)
            return
        super().lineReceived(line)

    def allHeadersReceived(self) -> None:
        self._head_bytes = self._head_lines = 0  # the next request on this connection starts its own head
        super().allHeadersReceived()

    def lineLengthExceeded(self, line: bytes) -> None:
        if not self._refused:
            self._refuse(431 if self._head_bytes else 414)  # no line yet: the request line itself

    def _refuse(self, status: int) -> None:
        self._refused = True
        transport: Any = self.transport  # a zope interface, which mypy reads wrong without mypy-zope
        transport.write(head_refusal(status))
        self.loseConnection()


_REFUSALS = {
    414: (b"URI Too Long", "uri_too_long", f"The request line is longer than {HEAD_LIMIT_BYTES} bytes."),
    431: (b"Request Header Fields Too Large", "request_header_fields_too_large",
          f"The request's header fields are larger than {HEAD_LIMIT_BYTES} bytes, or more than "
          f"{http.HTTPChannel.maxHeaders}."),
}


def head_refusal(status: int) -> bytes:
    """The whole response refusing a request head over the limit (414 or 431)."""
    reason, code, message = _REFUSALS[status]
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": code,
                                 "param": None}}).encode()
    return (b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
            % (status, reason, len(body)) + body)


class ServiceServer(Server):
    """daphne's Server with the access log redacted and the protocols set up as the module says."""

    def __init__(self, *args: Any, action_logger: Any = None, **kwargs: Any) -> None:
        if action_logger is not None:
            action_logger = RedactedAccessLog(action_logger)
        super().__init__(*args, action_logger=action_logger, ready_callable=self._configure_protocols, **kwargs)

    def _configure_protocols(self) -> None:
        """Runs once the factories exist and before the reactor accepts a connection."""
        self.http_factory.protocol = HeadLimitedHTTPChannel
        self.ws_factory.setProtocolOptions(failByDrop=False, closeHandshakeTimeout=self.ping_timeout)


class ServiceCommandLine(CommandLineInterface):
    """daphne's command line with :class:`ServiceServer` and a longer default opening handshake."""

    server_class = ServiceServer

    def __init__(self) -> None:
        super().__init__()
        self.parser.set_defaults(websocket_connect_timeout=OPEN_HANDSHAKE_TIMEOUT_S)


if __name__ == "__main__":
    ServiceCommandLine.entrypoint()
