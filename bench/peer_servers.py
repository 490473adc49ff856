"""The servers bench/peer_bench.py compares, each one process group it starts and stops: this
service as ``make run`` starts it (this tree's or another checkout's), ``vllm-mlx serve``,
``mlx_lm.server``, and this tree's engine alone in a process of its own (bench/engine_loop.py)."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from job_rows import job_rows

ROOT = Path(__file__).resolve().parents[1]


class Server:
    """One server process group; ``start`` returns (base url, model name, api key)."""

    def __init__(self, label: str, work: Path) -> None:
        self.label = label
        self.log = (work / f"{label}.log").open("ab")
        self.proc: subprocess.Popen | None = None

    def _spawn(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def stop(self) -> None:
        """SIGTERM to the whole process group, SIGKILL after 60 s; returns once no process of the
        group is left, so that the next server finds its port and the GPU free."""
        if self.proc is None:
            return
        for sig, seconds in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                self.proc.poll()  # reap the leader, or the group stays alive as a zombie
                try:
                    os.killpg(self.proc.pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.2)

    def phases(self, since: dt.datetime, until: dt.datetime) -> dict:
        """Where the time to first token went, for servers that record it (ours)."""
        return {}

    def redis_calls(self) -> dict[str, int]:
        """Each command's calls so far on the server's Redis (INFO commandstats; servers without
        one: empty)."""
        return {}

    def wait_ready(self, base: str, key: str = "") -> str:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.label} exited; see its log")
            try:
                r = httpx.get(f"{base}/v1/models", headers=headers, timeout=2)
                data = r.json().get("data") if r.status_code == 200 else None
                # This service lists a model with no live worker too, as unavailable: wait for one.
                if data and data[0].get("available", True):
                    return data[0]["id"]
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(1)
        raise RuntimeError(f"{self.label} did not become ready")


_CREATED: set[str] = set()  # the PostgreSQL databases this run has made


class OurService(Server):
    """The service from ``tree`` (this checkout, or an older one for an A/B), started as
    ``make run`` starts it, on a SQLite database of its own and a flushed Redis DB. With
    ``postgres`` (a server URL, no database name), on a fresh PostgreSQL database of its own
    instead, the web borrowing connections from psycopg's pool as scripts/run.sh has it."""

    def __init__(self, label: str, work: Path, tree: Path, model: str, batch: int, port: int,
                 postgres: str | None = None, web_processes: int | None = None) -> None:
        super().__init__(label, work)
        self.tree, self.port, self.postgres = tree, port, postgres
        self.web_processes = web_processes or int(os.environ.get("PEER_WEB_PROCESSES", "4"))
        database = f"{postgres.rstrip('/')}/peer_{label}" if postgres else f"sqlite:///{work}/{label}.sqlite3"
        self.env = {**os.environ, **engine_blas_env(), "DATABASE_URL": database, "MODEL_PATH": model,
                    "REDIS_URL": os.environ.get("PEER_REDIS_URL", "redis://127.0.0.1:6379/11"),
                    "ENGINE_COMPLETION_BATCH_SIZE": str(batch), "LOG_LEVEL": "WARNING",
                    "DEFAULT_KEY_REQUESTS_PER_MINUTE": "1000000", "DEFAULT_KEY_MAX_CONCURRENT_JOBS": "100000"}

    def start(self) -> tuple[str, str, str]:
        import redis

        redis.Redis.from_url(self.env["REDIS_URL"]).flushdb()
        if self.postgres:
            self._fresh_database()
        # As scripts/run.sh does: the web and the worker load while the database is migrated (the
        # worker takes no job before the migrations are in: WAIT_FOR_MIGRATIONS). `wait -n`: the shell
        # exits when either does, so wait_ready sees a failed start at once.
        web = self.web_processes
        pool = int(bool(self.postgres))  # the web's pool: PostgreSQL only; the worker keeps its connection
        script = (f"DB_POOL={pool} {sys.executable} -m inference_service.serve_web -b 127.0.0.1 -p {self.port} "
                  f"--processes {web} & DB_POOL=0 WAIT_FOR_MIGRATIONS=300 {sys.executable} manage.py "
                  f"run_engine_worker --loglevel WARNING & wait -n")
        self._spawn(["bash", "-c", script], self.tree, self.env)
        manage = [sys.executable, "manage.py"]
        subprocess.run([*manage, "migrate", "--noinput"], cwd=self.tree, env=self.env, check=True, capture_output=True)
        key = subprocess.run([*manage, "create_api_user", f"peer{os.getpid()}", "--quiet"], cwd=self.tree,
                             env=self.env, check=True, capture_output=True, text=True).stdout.split()[-1]
        base = f"http://127.0.0.1:{self.port}"
        return base, self.wait_ready(base, key), key


    def _fresh_database(self) -> None:
        """A new database at this run's first start of the label; later rounds reuse it, as they
        reuse a SQLite file, so that bench/ttft_phases.py finds every round's jobs."""
        import psycopg

        name = self.env["DATABASE_URL"].rsplit("/", 1)[1]
        if name in _CREATED:
            return
        _CREATED.add(name)
        with psycopg.connect(f"{self.postgres.rstrip('/')}/postgres", autocommit=True) as db:
            db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            db.execute(f'CREATE DATABASE "{name}"')

    def _job_times(self) -> list[tuple]:
        """Every job's (queued_at, started_at, first_token_at, finished_at) that has all four."""
        columns = ["queued_at", "started_at", "first_token_at", "finished_at"]
        return job_rows(self.env["DATABASE_URL"], columns, " AND ".join(f"{c} IS NOT NULL" for c in columns[1:]))

    def engine_memory(self) -> dict:
        """Where the worker's device memory is, from its last heartbeat: mlx's live arrays, its
        allocator cache and its limit, and the prefix cache's bytes and entries."""
        import redis

        client = redis.Redis.from_url(self.env["REDIS_URL"])
        for name in client.scan_iter("engine:workers:*"):
            beat = json.loads(client.get(name) or b"{}")
            memory, cache = beat.get("memory") or {}, beat.get("cache") or {}
            return {"active_gb": round(memory.get("active_bytes", 0) / 1e9, 2),
                    "peak_gb": round(memory.get("peak_bytes", 0) / 1e9, 2),
                    "allocator_cache_gb": round(memory.get("cache_bytes", 0) / 1e9, 2),
                    "prefix_cache_gb": round(float(cache.get("bytes_used") or 0) / 1e9, 2),
                    "prefix_cache_entries": cache.get("entries")}
        return {}

    def redis_calls(self) -> dict[str, int]:
        import redis

        stats = redis.Redis.from_url(self.env["REDIS_URL"]).info("commandstats")
        return {name.removeprefix("cmdstat_"): int(entry["calls"]) for name, entry in stats.items()}

    def phases(self, since: dt.datetime, until: dt.datetime) -> dict:
        """Medians over the jobs submitted in [since, until): queued -> claimed by the worker, and
        claimed -> first token (the rest of the TTFT is the web side: request, insert, stream)."""
        stamps = [s for s in self._job_times() if since <= s[0] < until]
        if not stamps:
            return {}
        return {"claim_p50_ms": round(1000 * statistics.median((s[1] - s[0]).total_seconds() for s in stamps), 1),
                "claim_to_token_p50_ms": round(1000 * statistics.median((s[2] - s[1]).total_seconds()
                                                                        for s in stamps), 1),
                "token_to_final_p50_ms": round(1000 * statistics.median((s[3] - s[2]).total_seconds()
                                                                        for s in stamps), 1)}


class VllmMlx(Server):
    def __init__(self, label: str, work: Path, model: str, batch: int, port: int) -> None:
        super().__init__(label, work)
        self.model, self.batch, self.port = model, batch, port

    def start(self) -> tuple[str, str, str]:
        code = "import sys; from vllm_mlx.cli import main; sys.argv[0] = 'vllm-mlx'; main()"
        self._spawn([sys.executable, "-c", code, "serve", self.model, "--served-model-name", "m", "--host",
                     "127.0.0.1", "--port", str(self.port), "--continuous-batching", "--completion-batch-size",
                     str(self.batch)], ROOT, _offline_env())
        base = f"http://127.0.0.1:{self.port}"
        return base, self.wait_ready(base), ""


class MlxLmServer(Server):
    def __init__(self, label: str, work: Path, model: str, batch: int, port: int) -> None:
        super().__init__(label, work)
        self.model, self.batch, self.port = model, batch, port

    def start(self) -> tuple[str, str, str]:
        self._spawn([sys.executable, "-m", "mlx_lm.server", "--model", self.model, "--host", "127.0.0.1", "--port",
                     str(self.port), "--decode-concurrency", str(self.batch)], ROOT, _offline_env())
        base = f"http://127.0.0.1:{self.port}"
        self.wait_ready(base)
        return base, "default_model", ""


class EngineLoop(Server):
    """Server ``engine``: the service's engine in process, under the same load (bench/engine_loop.py,
    a process of its own). Not an HTTP server: :meth:`run` stands for :func:`load`."""

    def __init__(self, label: str, work: Path, model: str, batch: int) -> None:
        super().__init__(label, work)
        self.model, self.batch = model, batch

    def start(self) -> None:
        # The worker's engine settings: the completion batch as OurService sets it, the policy and
        # the prefill batch inference_service/settings.py defaults to (the worker exports them).
        env = {**os.environ, **engine_blas_env(), "ENGINE_COMPLETION_BATCH_SIZE": str(self.batch),
               "ENGINE_POLICY": os.environ.get("ENGINE_POLICY", "priority"),
               "ENGINE_PREFILL_BATCH_SIZE": os.environ.get("ENGINE_PREFILL_BATCH_SIZE", "32")}
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "engine_loop.py"), "--model", self.model],
                                     cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, start_new_session=True)
        if self._read() != {"ready": True}:
            raise RuntimeError(f"{self.label} did not become ready")

    def run(self, concurrency: int, max_tokens: int, requests: int) -> dict:
        """``requests`` requests, ``concurrency`` at a time (closed loop): :func:`load`'s row."""
        assert self.proc is not None and self.proc.stdin is not None
        run = {"concurrency": concurrency, "max_tokens": max_tokens, "requests": requests}
        self.proc.stdin.write(json.dumps(run) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def stop(self) -> None:
        if self.proc is not None and self.proc.stdin is not None and self.proc.poll() is None:
            self.proc.stdin.close()  # the end of its input: it stops its engine and exits
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        super().stop()

    def _read(self) -> dict:
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.label} exited; see its log")
        return json.loads(line)


def engine_blas_env() -> dict[str, str]:
    """OpenBLAS's threads for an engine process, as scripts/run.sh sets them for its one worker:
    on a machine of at most 4 cores one core is left to the other processes (the web's, the
    client's). Without it, on 2 cores, OpenBLAS's spinning threads and the service's other
    processes share both cores and the service's decode steps wait for theirs. Both ``ours`` and
    ``engine`` get it; an OPENBLAS_NUM_THREADS already set wins. No effect on a GPU, where the model
    uses no BLAS."""
    if "OPENBLAS_NUM_THREADS" in os.environ:
        return {}
    cores = os.cpu_count() or 2
    return {"OPENBLAS_NUM_THREADS": str(max(1, cores - 1) if cores <= 4 else cores)}


def _offline_env() -> dict[str, str]:
    cache = Path(tempfile.gettempdir()) / "peer-hf"
    (cache / "hub").mkdir(parents=True, exist_ok=True)  # mlx_lm.server's /v1/models needs it
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(cache), "HF_HUB_CACHE": str(cache / "hub")}


def available(name: str) -> bool:
    module = {"vllm": "vllm_mlx", "mlxlm": "mlx_lm"}.get(name)
    if module is None:
        return True
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0
