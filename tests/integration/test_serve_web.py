"""inference_service.serve_web: several daphne processes on one socket, supervised."""

from __future__ import annotations

import json
import os
import signal
import socket
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


def _tcp_sockets(port: int, state: str) -> set[int]:
    """Inodes of this host's IPv4 TCP sockets on local ``port`` in ``state`` (0A listen, 01 established)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == state:
            inodes.add(int(fields[9]))
    return inodes


def _socket_inodes(pid: int) -> set[int]:
    out = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="SO_REUSEPORT balancing is Linux's")
def test_each_process_listens_on_its_own_socket_and_a_burst_of_connections_spreads_over_them(service_env, tmp_path):
    port = free_port()
    web = start_daphne(service_env, port, tmp_path, processes=2)
    clients: list[socket.socket] = []
    try:
        wait_for(lambda: port_open(port) and len(_children(web.pid)) == 2, START_TIMEOUT_S, "two daphne processes")
        children = _children(web.pid)
        listeners = _tcp_sockets(port, "0A")
        # One listening socket per process (a shared one would be a single socket in both).
        assert len(listeners) == 2
        assert all(len(_socket_inodes(pid) & listeners) == 1 for pid in children)

        # A burst: with one shared socket, the first process awake accepted nearly all of it.
        for _ in range(24):
            clients.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        local = {c.getsockname()[1] for c in clients}

        def accepted() -> list[int]:
            established = _tcp_sockets(port, "01")
            return [len(_socket_inodes(pid) & established) for pid in children]

        wait_for(lambda: sum(accepted()) == len(local), 30, "the processes to accept every connection")
        assert min(accepted()) >= 4, accepted()  # P(fewer than 4 of 24 on one side by chance) < 1e-4
        # The supervisor's own copies of the listening sockets are all it holds.
        assert _socket_inodes(web.pid) & _tcp_sockets(port, "01") == set()
    finally:
        for client in clients:
            client.close()
        code = web.stop(30)
    assert code == 0, web.log_tail()
