"""``make run`` (scripts/run.sh) as a new user meets it: the banner says how to keep the key and
reach /metrics, each run's demo key replaces the last, and Ctrl-C is an orderly stop."""

from __future__ import annotations

import json
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


def _post_job(base: str, key: str, body: dict) -> int:
    request = urllib.request.Request(f"{base}/api/v1/jobs", data=json.dumps(body).encode(), method="POST", headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=180) as response:
        return response.status


def _read_until(proc: subprocess.Popen, text: str, timeout: float) -> str:
    output, deadline = "", time.monotonic() + timeout
    while text not in output:
        assert proc.poll() is None, f"exited early:\n{output}"
        assert time.monotonic() < deadline, f"no {text!r} within {timeout:.0f} s:\n{output}"
        if select.select([proc.stdout], [], [], 1.0)[0]:
            output += os.read(proc.stdout.fileno(), 65536).decode()
    return output


def test_a_second_make_run_on_a_held_port_fails_naming_it_and_the_printed_webhook_secret_works(run_env, tmp_path):
    base = f"http://127.0.0.1:{run_env['PORT']}"
    first = Run(run_env)
    receiver = None
    try:
        banner = first.wait_ready()
        key = re.search(r"^  export KEY=(sk-\S+)$", banner, re.MULTILINE)[1]
        command = re.search(r"^  (WEBHOOK_SECRET=whsec_\S+) \S+ (scripts/webhook_receiver.py) 9000$", banner,
                            re.MULTILINE)

        # Another service (its own database) on the same port: it stops before starting anything.
        other = {**run_env, "DATABASE_URL": f"sqlite:///{tmp_path / 'other.sqlite3'}"}
        second = subprocess.run(["bash", "scripts/run.sh"], cwd=ROOT, env=other, capture_output=True, text=True,
                                timeout=120)
        assert second.returncode != 0, second.stdout
        assert f"error: port {run_env['PORT']} on 127.0.0.1 is in use by another process" in second.stderr
        assert "ready." not in second.stdout and "export KEY" not in second.stdout
        assert not (tmp_path / "other.sqlite3").exists()  # nothing started: not even its migrations
        for _ in range(6):  # the first one serves every request, with its own key
            assert _status(f"{base}/api/v1/usage", key) == 200

        # The printed command receives the demo key's webhooks, their signatures checked.
        hook_port = free_port()
        receiver = subprocess.Popen([str(ROOT / ".venv/bin/python"), command[2], str(hook_port)], cwd=ROOT,
                                    env={**run_env, "WEBHOOK_SECRET": command[1].split("=", 1)[1]},
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        _read_until(receiver, "receiving webhooks", 60)
        assert _post_job(base, key, {"prompt": "def f():", "max_tokens": 4,
                                     "webhook_url": f"http://127.0.0.1:{hook_port}/"}) == 202
        received = _read_until(receiver, "(signature verified)", 180)
        assert "job.completed" in received

        returncode, _tail = first.ctrl_c()
    finally:
        first.kill()
        if receiver is not None:
            receiver.kill()
            receiver.wait()
    assert returncode == 0, first.output
