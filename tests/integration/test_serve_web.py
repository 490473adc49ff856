"""inference_service.serve_web: several daphne processes on one socket, supervised."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.integration.procs import START_TIMEOUT_S, free_port, port_open, start_daphne, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _health(port: int) -> dict:
    """The health checks (503 without an engine worker, as here: the body still answers)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=30) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())


def test_processes_share_the_port_a_dead_one_is_replaced_and_sigterm_stops_all(service_env, tmp_path):
    port = free_port()
    web = start_daphne(service_env, port, tmp_path, processes=2)
    try:
        wait_for(lambda: port_open(port) and len(_children(web.pid)) == 2, START_TIMEOUT_S, "two daphne processes")
        first = _children(web.pid)
        assert all(_health(port)["checks"]["database"]["ok"] for _ in range(6))

        os.kill(first[0], signal.SIGKILL)
        wait_for(lambda: len(_children(web.pid)) == 2 and first[0] not in _children(web.pid), 60,
                 "the killed process to be replaced")
        # The survivor kept serving meanwhile, and the replacement serves too.
        deadline = time.monotonic() + 60
        while True:
            try:
                assert _health(port)["checks"]["database"]["ok"]
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        children = _children(web.pid)
    finally:
        code = web.stop(30)
    assert code == 0, web.log_tail()
    assert all(not Path(f"/proc/{pid}").exists() for pid in children)
