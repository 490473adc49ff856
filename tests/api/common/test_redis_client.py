"""The web process's sync Redis client under more threads than it has connections."""

from __future__ import annotations

import threading

from api.common.redis_client import SYNC_CONNECTIONS


def test_threads_beyond_the_pool_wait_for_a_connection_instead_of_failing(redis_client):
    client = redis_client
    threads, errors = SYNC_CONNECTIONS + 50, []
    start = threading.Barrier(threads)

    def hold_a_connection() -> None:
        start.wait()
        try:
            client.blpop(["test:redis_client:never"], timeout=0.3)  # holds its connection 0.3 s
        except Exception as exc:  # noqa: BLE001 - every failure is the finding
            errors.append(exc)

    workers = [threading.Thread(target=hold_a_connection) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
