"""Webhook receivers for tests, real servers on loopback in threads: :class:`WebhookReceiver`
answers each POST with the next status of a script (then 200), after ``delay_s``, and keeps what
it received; :class:`HangingReceiver` accepts connections and never answers."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: str
    at: float  # time.monotonic() when it arrived


class WebhookReceiver:
    def __init__(self, statuses: list[int] | None = None, *, location: str | None = None,
                 delay_s: float = 0.0) -> None:
        self.statuses = list(statuses or [])
        self.delay_s = delay_s
        self.location = location  # sent with 3xx answers, to check it is never followed
        self.received: list[Received] = []
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", "0"))).decode()
                arrived = time.monotonic()
                time.sleep(receiver.delay_s)
                with receiver.arrived:
                    receiver.received.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()},
                                                      body, arrived))
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                    receiver.arrived.notify_all()
                self.send_response(status)
                if receiver.location and 300 <= status < 400:
                    self.send_header("location", receiver.location)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks"

    def wait_for(self, count: int, timeout: float) -> list[Received]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.received) >= count, timeout)
            return list(self.received)

    def __enter__(self) -> WebhookReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class HangingReceiver:
    """Accepts every connection, reads nothing and never answers (until it is closed)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.connections: list[socket.socket] = []
        self.closed = False
        self.thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.getsockname()[1]}/hooks"

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections.append(conn)

    def __enter__(self) -> HangingReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed = True
        try:
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the accept
        except OSError:
            pass
        self.server.close()
        for conn in self.connections:
            conn.close()
