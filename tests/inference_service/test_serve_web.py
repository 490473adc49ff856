"""inference_service.serve_web on a port another server holds: it exits 1 naming the port and
starts no daphne, also when that server is another serve_web whose sockets share the port with
SO_REUSEPORT (which a bind with SO_REUSEPORT alone would join silently)."""

from __future__ import annotations

import logging
import socket

import pytest

from inference_service import serve_web


@pytest.mark.parametrize("processes", [1, 2])
def test_a_second_launcher_on_a_held_port_exits_1_naming_the_port_and_the_first_keeps_it(processes, caplog,
                                                                                          monkeypatch):
    first = serve_web.listening_sockets("127.0.0.1", 0, 2)  # a running launcher's group
    port = first[0].getsockname()[1]
    started: list[serve_web.Supervisor] = []

    def run(self: serve_web.Supervisor) -> int:
        started.append(self)
        return 0

    monkeypatch.setattr(serve_web.Supervisor, "run", run)
    monkeypatch.setattr(serve_web.signal, "signal", lambda *args: None)
    try:
        with caplog.at_level(logging.ERROR, logger="serve_web"):
            code = serve_web.main(["-b", "127.0.0.1", "-p", str(port), "--processes", str(processes)])
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # the first group still listens
    finally:
        for sock in first:
            sock.close()
    assert code == 1 and started == []
    assert f"port {port} on 127.0.0.1 is in use by another process" in caplog.text
