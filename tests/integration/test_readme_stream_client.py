"""A WebSocket client written from docs/streaming.md alone follows jobs across a worker's kill -9.

The client below knows only what docs/streaming.md says of ``/ws/v1/jobs/<id>/?after=<seq>``: a ``delta``
appends its text, a ``reset`` drops the text held (the job runs again from the start and its deltas
continue after the reset's seq), the ``final`` ends the job; keep the seq of the last delta or
reset, and resume a dropped connection with ``after=<that seq>``. Real daphne, real engine workers
(subprocesses), Redis and PostgreSQL; the reconciler is ticked by the test, as in
test_durability.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field

import pytest
import websockets

from api.jobs.tasks import reconcile_jobs
from api.models import JobStatus
from tests.api.factories import make_api_key
from tests.integration.jobs import job, queue_job, wait_status
from tests.integration.procs import START_TIMEOUT_S, free_port, port_open, start_daphne, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CLIENT_TIMEOUT_S = 300.0


@dataclass
class ReadmeClient:
    """Follows one job over ``/ws/v1/jobs/<id>/`` exactly as docs/streaming.md says."""

    port: int
    secret: str
    job_id: str
    text: str = ""
    last_seq: int = 0
    deltas: int = 0
    resets: int = 0
    final: dict | None = None
    connections: int = 0
    log: list[str] = field(default_factory=list)

    async def follow(self, *, stop_after_deltas: int | None = None) -> None:
        """Read messages until the final (or, with ``stop_after_deltas``, drop the connection
        once that many deltas came, as a client that goes away)."""
        url = f"ws://127.0.0.1:{self.port}/ws/v1/jobs/{self.job_id}/?after={self.last_seq}"
        self.connections += 1
        async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {self.secret}"},
                                      open_timeout=60) as ws:
            async for raw in ws:
                message = json.loads(raw)
                self.log.append(f"{message['type']}:{message.get('seq')}")
                if message["type"] == "delta":
                    self.text += message["text"]
                    self.last_seq = message["seq"]
                    self.deltas += 1
                elif message["type"] == "reset":
                    self.text = ""
                    self.last_seq = message["seq"]
                    self.resets += 1
                elif message["type"] == "final":
                    self.final = message
                    return
                else:
                    raise AssertionError(f"job {self.job_id}: {message}")
                if stop_after_deltas is not None and self.deltas >= stop_after_deltas:
                    return

    async def follow_to_the_end(self) -> None:
        """Follow, reconnecting with ``after=<last seq>`` whenever the connection drops."""
        while self.final is None:
            try:
                await self.follow()
            except (websockets.ConnectionClosed, OSError):
                await asyncio.sleep(0.2)


@pytest.fixture
def web(service_env, tmp_path):
    """daphne alone (one process) on a free port; the test starts and kills the workers."""
    port = free_port()
    daphne = start_daphne(service_env, port, tmp_path)

    def up() -> bool:
        assert daphne.alive(), daphne.log_tail()
        return port_open(port)

    wait_for(up, START_TIMEOUT_S, "daphne to listen")
    yield port
    daphne.stop()


def test_a_client_that_follows_the_readme_holds_the_stored_text_after_a_kill_9_mid_stream(web, workers, redis_db):
    first = workers.start("w-readme-killed")
    api_key, secret = make_api_key()
    job_ids = [queue_job(f"Once upon a time {i}", max_tokens=1200, api_key=api_key) for i in range(4)]
    # Two clients stay connected through the kill and the restart; two leave after a few deltas
    # and come back with after=<last seq> once their jobs run again.
    staying = [ReadmeClient(web, secret, j) for j in job_ids[:2]]
    leaving = [ReadmeClient(web, secret, j) for j in job_ids[2:]]
    restarted = threading.Event()
    errors: list[BaseException] = []

    async def clients() -> None:
        async def leave_and_return(client: ReadmeClient) -> None:
            await client.follow(stop_after_deltas=3)
            await asyncio.to_thread(restarted.wait, CLIENT_TIMEOUT_S)
            await client.follow_to_the_end()

        async with asyncio.timeout(CLIENT_TIMEOUT_S):
            await asyncio.gather(*(c.follow_to_the_end() for c in staying), *(leave_and_return(c) for c in leaving))

    def run_clients() -> None:
        try:
            asyncio.run(clients())
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    thread = threading.Thread(target=run_clients, daemon=True)
    thread.start()
    everyone = staying + leaving
    wait_for(lambda: errors or all(c.deltas >= 3 for c in everyone), 120, "every client to hold some text")
    assert not errors, errors
    assert all(job(j).status == JobStatus.IN_PROGRESS for j in job_ids)
    first.kill9()

    workers.start("w-readme-new")

    def running_again() -> bool:
        reconcile_jobs()  # what celery beat runs every 10 s: hands the dead worker's jobs on
        return all(job(j).attempts == 2 for j in job_ids)

    wait_for(running_again, 240, "every job to run again", interval=0.2)
    restarted.set()
    for job_id in job_ids:
        wait_status(job_id, (JobStatus.COMPLETED,), tick=reconcile_jobs)
    thread.join(CLIENT_TIMEOUT_S)
    assert not thread.is_alive() and not errors, errors

    for client in everyone:
        stored = job(client.job_id)
        assert stored.attempts == 2 and stored.completion_tokens == 1200
        assert client.final is not None and client.final["status"] == "completed", client.log[-5:]
        assert client.resets >= 1, client.log  # each held the first run's text when its job restarted
        assert client.text == stored.output_text, client.log
    assert all(c.connections >= 2 for c in leaving)
