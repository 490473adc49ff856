"""The service's daphne command line: a WebSocket's opening handshake, the application's accept
included, may take as long as daphne waits for a keep-alive pong. With daphne's 5 s, 300 streams
and 300 REST jobs at once on 2 cores (make run, SQLite) had most of the streams' connections
dropped before their handshake's answer, without a close code (bench/stream_bench.py)."""

from __future__ import annotations

from inference_service.daphne_server import OPEN_HANDSHAKE_TIMEOUT_S, ServiceCommandLine


def test_the_opening_handshake_waits_as_long_as_a_keep_alive_pong_unless_set():
    parser = ServiceCommandLine().parser
    defaults = parser.parse_args(["inference_service.asgi:application"])
    chosen = parser.parse_args(["--websocket_connect_timeout", "7", "inference_service.asgi:application"])

    # daphne's command line gives this value to both its accept timeout and autobahn's openHandshakeTimeout.
    assert defaults.websocket_connect_timeout == OPEN_HANDSHAKE_TIMEOUT_S >= defaults.ping_timeout
    assert chosen.websocket_connect_timeout == 7
