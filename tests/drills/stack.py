"""The running service for the drills: a database of its own (PostgreSQL or a SQLite file), a
Redis DB, daphne, engine workers and the reconciler, all as subprocesses that the drills reach
only through HTTP, WebSockets, Redis, process signals and the database server itself.

The reconciler runs as beat would run ``api.tasks.reconcile_jobs``, every half second instead of
every 10 s, so a dead worker's jobs move on within the drills' time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

from tests.integration.procs import ROOT, START_TIMEOUT_S, Proc, free_port, port_open, start_daphne, wait_for

# Short leases and intervals: a dead worker's jobs are handed on within ~3 s.
FAST_ENV = {
    "JOB_LEASE_S": "2",
    "WORKER_HEARTBEAT_S": "0.5",
    "JOB_REDISPATCH_AFTER_S": "2",
    # A worker told to stop hands its jobs back almost at once (the SIGTERM drill's point).
    "WORKER_DRAIN_S": "0.2",
    # Every drill's jobs fit in one key's quotas.
    "DEFAULT_KEY_MAX_CONCURRENT_JOBS": "200",
    "DEFAULT_KEY_REQUESTS_PER_MINUTE": "100000",
    "DEFAULT_KEY_TOKENS_PER_DAY": "100000000",
    "OPENBLAS_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
    "DJANGO_SETTINGS_MODULE": "inference_service.settings",
}

USERS = 12  # one per drill, each with two keys

SETUP = """
import io, json
from django.core.management import call_command
call_command("migrate", interactive=False, verbosity=0)

def key(name):
    out = io.StringIO()
    call_command("create_api_user", name, quiet=True, stdout=out)
    return out.getvalue().strip()

print(json.dumps([[key(f"drill-{{i}}"), key(f"drill-{{i}}")] for i in range({users})]))
"""

RECONCILER = """
import logging, time
import django
django.setup()
from django.db import close_old_connections
from api.jobs.tasks import reconcile_jobs
log = logging.getLogger("drill-reconciler")
while True:
    try:
        reconcile_jobs()
    except Exception:  # the database or Redis is being attacked: beat would simply run it again
        log.warning("reconcile_jobs failed", exc_info=True)
    close_old_connections()
    time.sleep(0.5)
"""


def manage(env: dict[str, str], *args: str, timeout: float = 180) -> str:
    out = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout


@contextmanager
def postgres_database(server_url: str, name: str) -> Iterator[str]:
    """A fresh PostgreSQL database ``name`` on ``server_url``'s server, dropped afterwards."""
    admin = urlunsplit(urlsplit(server_url)._replace(path="/postgres"))

    def run(sql: str) -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql)

    run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    run(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(server_url)._replace(path=f"/{name}"))
    finally:
        run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def terminate_connections(database_url: str) -> int:
    """``pg_terminate_backend`` on every other session of the database: how many it ended."""
    name = urlsplit(database_url).path.lstrip("/")
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE datname = %s AND pid <> pg_backend_pid()", [name]).fetchall()
    return sum(1 for (ended,) in rows if ended)


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo += children.get(current, [])
    return tree


@contextmanager
def frozen(pids: list[int]) -> Iterator[None]:
    """SIGSTOP every process of ``pids``' trees (a stuck worker), SIGCONT them afterwards."""
    stopped = [p for pid in pids for p in process_tree(pid)]
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:  # killed meanwhile
                pass


class Stack:
    """daphne, the reconciler and engine workers on one database and one Redis DB."""

    def __init__(self, *, database_url: str, redis_url: str, model_path: Path, log_dir: Path) -> None:
        self.database_url = database_url
        self.redis_url = redis_url
        self.log_dir = log_dir
        self.env = {**os.environ, **FAST_ENV, "DATABASE_URL": database_url, "REDIS_URL": redis_url,
                    "MODEL_PATH": str(model_path), "DB_POOL": "0"}
        self.env.pop("TEST_DATABASE_NAME", None)
        self.port = free_port()
        self.workers: dict[str, Proc] = {}
        self._procs: list[Proc] = []
        self._started = 0

    def start(self, *, workers: int) -> None:
        """Migrate the database and make the drills' keys (one process, as an operator would with
        ``migrate`` and ``create_api_user``), then start daphne, the reconciler and ``workers``
        engine workers together and wait until all of them are up."""
        out = manage(self.env, "shell", "-c", SETUP.format(users=USERS))
        self._keys = json.loads(out.strip().splitlines()[-1])
        # As scripts/run.sh serves: two web processes on one port, borrowing PostgreSQL
        # connections from a pool.
        web_env = {**self.env, "DB_POOL": "1" if self.database_url.startswith("postgres") else "0"}
        daphne = self._spawn(start_daphne(web_env, self.port, self.log_dir, processes=2))
        self._spawn(Proc("reconciler", [sys.executable, "-c", RECONCILER], self.env, self.log_dir))
        self.ensure_workers(workers)

        def listening() -> bool:
            assert daphne.alive(), f"daphne exited:\n{daphne.log_tail()}"
            return port_open(self.port)

        wait_for(listening, START_TIMEOUT_S, "daphne to listen")

    def _spawn(self, proc: Proc) -> Proc:
        self._procs.append(proc)
        return proc

    def user_keys(self) -> list[str]:
        """The two keys of a user no other drill uses."""
        return self._keys.pop()

    # -- engine workers ---------------------------------------------------------------------

    def ensure_workers(self, n: int) -> list[str]:
        """Start workers (all at once) until ``n`` are alive and wait until they are ready;
        returns the ids of the live ones."""
        for worker_id in [w for w, proc in self.workers.items() if not proc.alive()]:
            del self.workers[worker_id]
        starting = [self.start_worker() for _ in range(n - len(self.workers))]
        for worker_id in starting:
            self.wait_ready(worker_id)
        return list(self.workers)

    def start_worker(self) -> str:
        """Start one more worker (a supervisor's restart); returns its id without waiting."""
        self._started += 1
        worker_id = f"drill-w{self._started}"
        argv = [sys.executable, "manage.py", "run_engine_worker", "--worker-id", worker_id, "--loglevel", "INFO"]
        self.workers[worker_id] = self._spawn(Proc(f"worker-{worker_id}", argv, self.env, self.log_dir))
        return worker_id

    def wait_ready(self, worker_id: str) -> None:
        proc = self.workers[worker_id]
        line = f"engine worker {worker_id} ready".encode()

        def ready() -> bool:
            assert proc.alive(), f"worker {worker_id} exited:\n{proc.log_tail()}"
            return line in proc.log_path.read_bytes()

        wait_for(ready, START_TIMEOUT_S, f"worker {worker_id} to start")

    def stop(self) -> None:
        for proc in reversed(self._procs):
            proc.stop(timeout=20)

    def logs(self, n: int = 3000) -> str:
        """The tail of every process's log, for a failed drill's report."""
        return "\n".join(f"--- {proc.name}\n{proc.log_tail(n)}" for proc in self._procs)
