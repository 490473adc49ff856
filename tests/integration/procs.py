"""Subprocesses of the integration tests: engine workers and daphne, with logs in files."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# Generous: the suite shares 2 CPU cores with other work, and a worker loads a model at start.
START_TIMEOUT_S = 180.0


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``condition`` until it returns something truthy; fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


class Proc:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.popen = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, n: int = 4000) -> str:
        return self.log_path.read_bytes()[-n:].decode(errors="replace")

    def children(self, command_part: str) -> list[int]:
        """Pids of this process's children whose command line contains ``command_part``."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and _ppid(int(entry.name)) == self.pid:
                try:
                    cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if command_part in cmdline:
                    found.append(int(entry.name))
        return found

    def kill9(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        self.popen.wait(30)

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit in ``timeout`` seconds."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(30)
        self._log.close()
        return self.popen.returncode


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def start_worker(env: dict[str, str], worker_id: str, log_dir: Path) -> Proc:
    argv = [sys.executable, "manage.py", "run_engine_worker", "--worker-id", worker_id, "--loglevel", "INFO"]
    return Proc(f"worker-{worker_id}", argv, env, log_dir)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daphne(env: dict[str, str], port: int, log_dir: Path, processes: int | None = None) -> Proc:
    """daphne alone (as the service runs it: inference_service.daphne_server), or with ``processes``
    the multi-process launcher (inference_service.serve_web)."""
    if processes is None:
        argv = [sys.executable, "-m", "inference_service.daphne_server", "-b", "127.0.0.1", "-p", str(port), "inference_service.asgi:application"]
    else:
        argv = [sys.executable, "-m", "inference_service.serve_web", "-b", "127.0.0.1", "-p", str(port),
                "--processes", str(processes)]
    return Proc("daphne", argv, env, log_dir)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_celery_workers(env: dict[str, str], log_dir: Path) -> tuple[Proc, Proc]:
    """The light worker (queue ``celery``, one task at a time) and the webhooks worker (queue
    ``webhooks``, Celery's thread pool), as scripts/run.sh starts them."""
    celery = [sys.executable, "-m", "celery", "-A", "inference_service", "worker", "--loglevel", "INFO"]
    light = Proc("light-worker", [*celery, "-Q", "celery", "-P", "solo", "-n", "light@%h"], env, log_dir)
    hooks = Proc("webhooks-worker", [*celery, "-Q", "webhooks", "-P", "threads", "-c", "8", "-n", "webhooks@%h"],
                 env, log_dir)
    return light, hooks


def celery_ready(proc: Proc) -> bool:
    """Whether a Celery worker started (its log says ``ready.``); fails if it exited."""
    assert proc.alive(), f"{proc.name} exited:\n{proc.log_tail()}"
    return b"ready." in proc.log_path.read_bytes()


@contextmanager
def webhook_stack(env: dict[str, str], log_dir: Path) -> Iterator[int]:
    """daphne, the light and webhooks Celery workers and celery beat, as scripts/run.sh starts
    them; yields daphne's port once all are up, and stops them after."""
    port = free_port()
    daphne = start_daphne(env, port, log_dir)
    light, hooks = start_celery_workers(env, log_dir)
    beat = Proc("beat", [sys.executable, "-m", "celery", "-A", "inference_service", "beat", "--loglevel", "INFO",
                         "-s", str(log_dir / "beat-schedule")], env, log_dir)

    def up() -> bool:
        for proc in (daphne, beat):
            assert proc.alive(), proc.log_tail()
        return port_open(port) and celery_ready(light) and celery_ready(hooks)

    try:
        wait_for(up, START_TIMEOUT_S, "daphne, the Celery workers and beat")
        yield port
    finally:
        for proc in (beat, hooks, light, daphne):
            proc.stop()
