"""The database's connections terminated under a running web process (``pg_terminate_backend``, as
a failover or an operator does): the next requests get fresh connections, and none is a 500.
Real daphne (as scripts/run.sh serves it), real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import websockets
from django.db import connection

from tests.api.factories import make_api_key
from tests.integration.jobs import queue_job
from tests.integration.procs import START_TIMEOUT_S, free_port, port_open, start_daphne, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _get(port: int, path: str, secret: str) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {secret}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _others() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid()")
        return cursor.fetchone()[0]


def _terminate_the_services_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        return cursor.fetchone()[0]


@pytest.mark.parametrize("db_env", [{"DB_POOL": "1"}, {"DB_POOL": "0", "DB_CONN_MAX_AGE": "600"}],
                         ids=["pool", "persistent"])
def test_after_the_connections_were_terminated_no_request_is_a_500_and_the_next_ones_get_fresh_ones(
        service_env, tmp_path, db_env):
    api_key, secret = make_api_key()
    job_id = queue_job("Once upon a time", max_tokens=4, dispatch=False, api_key=api_key)
    port = free_port()
    web = start_daphne({**service_env, **db_env}, port, tmp_path, processes=1)
    path = f"/api/v1/jobs/{job_id}"
    try:
        wait_for(lambda: port_open(port), START_TIMEOUT_S, "daphne to listen")
        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(lambda _: _get(port, path, secret)[0], range(40))) == [200] * 40
            assert _others() > 0  # the web process holds connections
            terminated = _terminate_the_services_connections()
            wait_for(lambda: _others() == 0, 30, "the terminated backends to exit")

            started = time.monotonic()
            lone_socket = asyncio.run(_job_socket_close(port, secret))  # one request alone, on a socket
            burst = list(pool.map(lambda _: _get(port, path, secret), range(60)))
            after = [_get(port, path, secret)[0] for _ in range(10)]
            took = time.monotonic() - started
    finally:
        web.stop(30)

    # No 500: a request that met a dead connection is a 503 the client retries, in the envelope.
    assert lone_socket in (4404, 4503)  # the unknown job's answer, or "retry" (never a crash's 1011)
    assert {status for status, _ in burst} <= {200, 503}, web.log_tail()
    for status, body in burst:
        assert status == 200 or body["error"]["code"] == "service_unavailable"
    assert sum(status == 503 for status, _ in burst) <= terminated  # at most one per dead connection
    assert after == [200] * 10  # every dead connection is gone
    assert took < 10  # nobody waited out a timeout


async def _job_socket_close(port: int, secret: str) -> int:
    url = f"ws://127.0.0.1:{port}/ws/v1/jobs/{uuid.uuid4()}/?api_key={secret}"
    async with websockets.connect(url, open_timeout=60) as ws:
        try:
            while True:
                await asyncio.wait_for(ws.recv(), 30)
        except websockets.ConnectionClosed as closed:
            return closed.rcvd.code
