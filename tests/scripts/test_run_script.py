"""``make run`` (scripts/run.sh) as a new user meets it: the banner says how to keep the key and
reach /metrics, each run's demo key replaces the last, and Ctrl-C is an orderly stop."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis

from tests.integration.conftest import INTEGRATION_REDIS_DB
from tests.integration.procs import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 400


def _status(url: str, token: str) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=180) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


class Run:
    """One ``scripts/run.sh`` in a session of its own, as a terminal runs it: Ctrl-C is a SIGINT
    to the terminal's foreground process group, the script's."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(["bash", "scripts/run.sh"], cwd=ROOT, env=env, start_new_session=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.output = ""

    def wait_ready(self) -> str:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while "Ctrl-C stops everything." not in self.output:
            assert self.proc.poll() is None, f"run.sh exited early:\n{self.output}"
            assert time.monotonic() < deadline, f"run.sh not ready:\n{self.output}"
            if select.select([self.proc.stdout], [], [], 1.0)[0]:
                self.output += os.read(self.proc.stdout.fileno(), 65536).decode()
        return self.output

    def ctrl_c(self) -> tuple[int, str]:
        os.killpg(self.proc.pid, signal.SIGINT)
        rest = self.proc.communicate(timeout=120)[0].decode()
        self.output += rest
        return self.proc.returncode, rest

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def run_env(tmp_path, tiny_model_path):
    url = f"redis://127.0.0.1:6379/{INTEGRATION_REDIS_DB}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    env = {k: v for k, v in os.environ.items() if k not in ("METRICS_TOKEN", "DATABASE_URL", "WORKER_ID")}
    env.update(DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}", REDIS_URL=url, MODEL_PATH=str(tiny_model_path),
               PORT=str(free_port()), WEB_PROCESSES="1", OPENBLAS_NUM_THREADS="1", WORKER_DRAIN_S="2")
    yield env
    client.flushdb()


def test_make_run_prints_an_export_line_and_the_metrics_token_and_stops_cleanly_on_ctrl_c(run_env):
    base = f"http://127.0.0.1:{run_env['PORT']}"
    keys = []
    for _ in range(2):
        run = Run(run_env)
        try:
            banner = run.wait_ready()
            key = re.search(r"^  export KEY=(sk-\S+)$", banner, re.MULTILINE)[1]
            metrics = re.search(r'curl -s \S+/metrics -H "Authorization: Bearer (\S+)"', banner)[1]
            keys.append(key)
            assert '-H "Authorization: Bearer $KEY"' in banner  # the examples use what the export sets

            assert _status(f"{base}/metrics", metrics) == 200
            assert _status(f"{base}/metrics", "wrong") == 401
            assert _status(f"{base}/api/v1/usage", key) == 200
            if len(keys) == 2:  # the first run's key was replaced by this one
                assert _status(f"{base}/api/v1/usage", keys[0]) == 401

            returncode, tail = run.ctrl_c()
        finally:
            run.kill()
        assert returncode == 0, run.output
        assert tail.rstrip().endswith("stopped."), tail
        assert "a process exited" not in run.output
