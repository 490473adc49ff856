"""peer_bench's client in several processes: every request of a level is sent once, shared out over
the processes, and the level's figures cover them all (against a small streaming server here)."""

from __future__ import annotations

import json
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing import get_context
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import peer_bench  # noqa: E402


class _Chat(BaseHTTPRequestHandler):
    """Streams two content chunks and a usage chunk; records each request's message and its peer."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, int]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((body["messages"][0]["content"], self.client_address[1]))
        events = [{"choices": [{"delta": {"content": "a"}}]}, {"choices": [{"delta": {"content": "b"}}]},
                  {"choices": [], "usage": {"completion_tokens": 2}}]
        payload = "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode() + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


def test_a_level_shared_over_client_processes_sends_each_request_once_and_counts_them_all() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    _Chat.seen = []
    try:
        with ProcessPoolExecutor(3, mp_context=get_context("spawn")) as pool:
            row = peer_bench.load_in(pool, 3, base, "m", "", concurrency=7, max_tokens=2, requests=20)
    finally:
        server.shutdown()
    messages = sorted(int(m.rsplit("#", 1)[1]) for m, _ in _Chat.seen)
    assert messages == list(range(20))  # each request once: the shares' message numbers do not overlap
    assert row["errors"] == 0 and row["req_s"] > 0
    assert abs(row["tok_s"] - 2 * row["req_s"]) <= 0.2  # two tokens a request
    assert row["client_cpu"] >= row["client_cpu_max"] > 0
    # 7 clients in 3 processes keep at most 7 connections (keep-alive), from more than one process.
    assert 3 <= len({port for _, port in _Chat.seen}) <= 7


def test_without_a_pool_the_level_runs_in_this_process() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Chat.seen = []
    try:
        row = peer_bench.load_in(None, 1, f"http://127.0.0.1:{server.server_address[1]}", "m", "", 4, 2, 8)
    finally:
        server.shutdown()
    assert len(_Chat.seen) == 8 and row["errors"] == 0 and "client_cpu_max" not in row and "records" not in row
