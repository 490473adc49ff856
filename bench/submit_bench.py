"""Submission benchmark (issue 43): POST /api/v1/jobs per second, this tree against another.

Each tree (``--tree LABEL=PATH``, default ``main=/work/main`` and ``this=`` this checkout) runs its
own stack at once, from its own folder and virtualenv, with the same settings: daphne
(``inference_service.serve_web``, ``--processes``), one engine worker (``run_engine_worker``, the
model at ``--model``) and a private redis-server on ``--redis-port`` (one Redis database per
tree), each tree on a PostgreSQL database of its own (``submit_bench_<label>``, made afresh). The
keys' quotas are far above the load: the bench measures the path, not the refusals.

Clients: ``--clients`` concurrent loops, each POSTing one-token jobs (``max_tokens=1``) back to
back on new connections, spread over ``--keys`` API keys (1: every submission of one key).
Levels (clients x keys) run ``--rounds`` rounds of ``--seconds`` each, the trees interleaved
within each round. Between runs a tree's jobs are drained (``full``) or cancelled in its database
(``web``), so each run starts on an empty queue.

Modes (``--modes``): ``full``, the engine worker consumes (the whole job path; on a small machine
the worker side is the ceiling); ``web``, no engine worker: the rate at which the web tier answers
202s, the submission path by itself; ``gate``, no HTTP: ``--clients`` threads of one process
calling ``job_create`` back to back (each tree's own code), the quota gate and the INSERT alone.

    python bench/submit_bench.py [--model var/models/tiny] [--clients 8,32] [--keys 1,10] \
        [--rounds 3] [--seconds 5] [--modes web,full]

Prints per run and per level the medians of req/s (202s per second) and p50/p95 latency, and the
ratio this/baseline; the LAST line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import median, percentile  # noqa: E402
from bench.http_clients import send_post  # noqa: E402

SETUP = """
import json
from django.contrib.auth import get_user_model
from api.keys.services import api_key_create
user, _ = get_user_model().objects.get_or_create(username="bench")
keys = [api_key_create(owner=user, name=f"bench{{i}}", requests_per_minute=10**9, tokens_per_day=10**15,
                       max_concurrent_jobs=10**9)[1] for i in range({keys})]
print("KEYS=" + json.dumps(keys))
"""

# The gate alone: threads of one process calling job_create back to back (no HTTP, no daphne), as
# the web tier's threads do; run by each tree's own code through ``manage.py shell``.
GATE = """
import json, threading, time
from django.db import connection
from api.jobs.services.submission import JobRequest, job_create
from api.models import ApiKey
keys = list(ApiKey.objects.filter(owner__username="bench").select_related("owner").order_by("id"))[:{keys}]
request = JobRequest(prompt="def f(x):", max_tokens=1)
job_create(owner=keys[0].owner, api_key=keys[0], request=request)  # loads the tokenizer
latencies, end = [], 0.0
ready = threading.Barrier({threads} + 1)
def loop(i):
    key = keys[i % len(keys)]
    job_create(owner=key.owner, api_key=key, request=request)  # this thread's connection
    ready.wait()
    while time.perf_counter() < end:
        t = time.perf_counter()
        job_create(owner=key.owner, api_key=key, request=request)
        latencies.append(time.perf_counter() - t)
    connection.close()
threads = [threading.Thread(target=loop, args=(i,)) for i in range({threads})]
[t.start() for t in threads]
end = time.perf_counter() + {seconds}
ready.wait()
t0 = time.perf_counter()
[t.join() for t in threads]
print("GATE=" + json.dumps({{"latencies": latencies, "wall": time.perf_counter() - t0}}))
"""


@dataclass
class Stack:
    label: str
    path: Path
    port: int
    redis_url: str
    database_url: str
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)
    model: Path = Path()
    log_dir: Path = Path()

    @property
    def python(self) -> str:
        venv = self.path / ".venv/bin/python"
        return str(venv if venv.exists() else Path(sys.executable))

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "DJANGO_SETTINGS_MODULE": "inference_service.settings", "PYTHONUNBUFFERED": "1",
                "DATABASE_URL": self.database_url, "REDIS_URL": self.redis_url, "OPENBLAS_NUM_THREADS": "1",
                "MODEL_PATH": str(self.model), "MODEL_NAME": self.model.name, **extra}

    def manage(self, *args: str, stdin: str | None = None) -> str:
        done = subprocess.run([self.python, "manage.py", *args], cwd=self.path, env=self.env(), input=stdin,
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{self.label}: manage.py {args[0]} failed:\n{done.stderr[-2000:]}")
        return done.stdout

    def start(self, *, model: Path, processes: int, keys: int, log_dir: Path) -> None:
        self.model, self.log_dir = model, log_dir
        self.manage("migrate", "--noinput")
        out = self.manage("shell", stdin=SETUP.format(keys=keys))
        self.keys = json.loads(next(line for line in out.splitlines() if line.startswith("KEYS="))[5:])
        web = [self.python, "-m", "inference_service.serve_web", "-b", "127.0.0.1", "-p", str(self.port),
               "--processes", str(processes)]
        self.procs["web"] = self._spawn("web", web, self.env(DB_POOL="1"), log_dir)

    def start_worker(self) -> None:
        if "worker" not in self.procs:
            cmd = [self.python, "manage.py", "run_engine_worker"]
            env = self.env(DB_POOL="0")
            self.procs["worker"] = self._spawn("worker", cmd, env, self.log_dir)

    def stop_worker(self) -> None:
        proc = self.procs.pop("worker", None)
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str], log_dir: Path) -> subprocess.Popen:
        log = open(log_dir / f"{self.label}-{name}.log", "ab")  # noqa: SIM115 - closed with the process
        return subprocess.Popen(cmd, cwd=self.path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()

    def web_cpu_s(self) -> float:
        """CPU seconds (user + system) of the web tier so far: every process of its group."""
        group, total = self.procs["web"].pid, 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == group:  # pgrp
                total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / os.sysconf("SC_CLK_TCK")

    def sql(self, statement: str) -> str:
        for _ in range(10):  # a shared server may refuse a connection for a moment (too many clients)
            done = subprocess.run(["psql", self.database_url, "-Atc", statement], capture_output=True, text=True,
                                  check=False)
            if done.returncode == 0:
                return done.stdout.strip()
            time.sleep(1)
        raise RuntimeError(f"{self.label}: psql failed: {done.stderr[-500:]}")


def database_url(base: str, name: str) -> str:
    return base.rsplit("/", 1)[0] + "/" + name


def fresh_database(base: str, name: str) -> str:
    admin = database_url(base, "postgres")
    subprocess.run(["psql", admin, "-qc", f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'], check=True,
                   capture_output=True)
    subprocess.run(["psql", admin, "-qc", f'CREATE DATABASE "{name}"'], check=True, capture_output=True)
    return database_url(base, name)


def ensure_redis(port: int, log_dir: Path) -> subprocess.Popen | None:
    import redis

    try:
        redis.Redis(port=port, socket_timeout=1).ping()
        return None
    except redis.RedisError:
        pass
    proc = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                             "--appendonly", "no"], stdout=open(log_dir / "redis.log", "ab"),  # noqa: SIM115
                            stderr=subprocess.STDOUT, start_new_session=True)
    for _ in range(50):
        try:
            redis.Redis(port=port, socket_timeout=1).ping()
            return proc
        except redis.RedisError:
            time.sleep(0.1)
    raise RuntimeError("redis-server did not start")


async def _post(port: int, key: str) -> int:
    reader, writer, _ = await send_post(port, key, "/api/v1/jobs", b'{"prompt": "def f(x):", "max_tokens": 1}')
    try:
        await writer.drain()
        status = (await reader.readline()).split(maxsplit=2)
        await reader.read()
    finally:
        writer.close()
    return int(status[1]) if len(status) > 1 else 0


async def load(port: int, keys: list[str], clients: int, seconds: float) -> dict:
    """``clients`` loops POSTing back to back for ``seconds``; client i uses key i % len(keys)."""
    latencies: list[float] = []
    errors: dict[str, int] = {}
    end = time.perf_counter() + seconds

    async def client(i: int) -> None:
        while time.perf_counter() < end:
            t = time.perf_counter()
            try:
                status = await _post(port, keys[i % len(keys)])
            except OSError as exc:
                status, _ = 0, exc
            if status == 202:
                latencies.append(time.perf_counter() - t)
            else:
                errors[str(status)] = errors.get(str(status), 0) + 1

    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    wall = time.perf_counter() - t0
    return {"accepted": len(latencies), "rps": len(latencies) / wall, "errors": errors,
            "p50_ms": 1000 * (percentile(latencies, 50) or 0), "p95_ms": 1000 * (percentile(latencies, 95) or 0)}


def settle(stack: Stack, mode: str, timeout_s: float = 120) -> None:
    """Start the next run on an empty queue: the worker finishes the jobs (full), or they are
    cancelled in the database and their messages dropped (web)."""
    if mode in ("web", "gate"):
        stack.sql("UPDATE api_job SET status = 'cancelled', finished_at = now() WHERE status IN ('queued', 'in_progress')")
        import redis

        client = redis.Redis.from_url(stack.redis_url)
        for name in client.scan_iter("engine*"):
            if client.type(name) == b"list":
                client.delete(name)
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if stack.sql("SELECT count(*) FROM api_job WHERE status IN ('queued', 'in_progress')") == "0":
                return
        except RuntimeError as exc:  # the shared server full for a while: keep waiting
            print(f"  {stack.label}: {exc}", flush=True)
        time.sleep(0.5)
    print(f"  {stack.label}: queue not drained in {timeout_s:.0f} s", flush=True)


def wait_ready(stack: Stack, mode: str, timeout_s: float = 300) -> None:
    import redis

    deadline = time.monotonic() + timeout_s
    client = redis.Redis.from_url(stack.redis_url)
    while time.monotonic() < deadline:
        try:
            web_up = asyncio.run(_post(stack.port, stack.keys[0])) == 202
        except OSError:
            web_up = False
        worker_up = mode != "full" or any(True for _ in client.scan_iter("engine:workers:*"))
        if web_up and worker_up:
            return
        time.sleep(1)
    raise RuntimeError(f"{stack.label} did not come up (logs in {stack.log_dir})")


def gate_load(stack: Stack, keys: int, threads: int, seconds: float) -> dict:
    out = stack.manage("shell", stdin=GATE.format(keys=keys, threads=threads, seconds=seconds))
    data = json.loads(next(line for line in out.splitlines() if line.startswith("GATE="))[5:])
    lat = data["latencies"]
    return {"accepted": len(lat), "rps": len(lat) / data["wall"], "errors": {},
            "p50_ms": 1000 * (percentile(lat, 50) or 0), "p95_ms": 1000 * (percentile(lat, 95) or 0)}


def run_mode(stacks: list[Stack], mode: str, args: argparse.Namespace) -> list[dict]:
    for stack in stacks:
        stack.start_worker() if mode == "full" else stack.stop_worker()
    for stack in stacks:
        wait_ready(stack, mode)
        settle(stack, mode)
    if mode == "gate":
        return run_gate(stacks, args)
    results = []
    for clients in args.clients:
        for nkeys in args.keys:
            for rnd in range(args.rounds):
                order = stacks if rnd % 2 == 0 else stacks[::-1]
                for stack in order:
                    cpu = stack.web_cpu_s()
                    figures = asyncio.run(load(stack.port, stack.keys[:nkeys], clients, args.seconds))
                    figures["web_cpu_ms_per_job"] = 1000 * (stack.web_cpu_s() - cpu) / max(1, figures["accepted"])
                    settle(stack, mode)
                    row = {"mode": mode, "clients": clients, "keys": nkeys, "round": rnd, "tree": stack.label,
                           **figures}
                    results.append(row)
                    print(f"  {mode} c={clients} k={nkeys} r={rnd} {stack.label:>6}: {figures['rps']:7.1f} req/s  "
                          f"p50 {figures['p50_ms']:6.0f} ms  p95 {figures['p95_ms']:6.0f} ms  "
                          f"web CPU {figures['web_cpu_ms_per_job']:5.1f} ms/job  errors {figures['errors']}", flush=True)
    return results


def run_gate(stacks: list[Stack], args: argparse.Namespace) -> list[dict]:
    results = []
    for threads in args.clients:
        for nkeys in args.keys:
            for rnd in range(args.rounds):
                for stack in (stacks if rnd % 2 == 0 else stacks[::-1]):
                    figures = gate_load(stack, nkeys, threads, args.seconds)
                    settle(stack, "gate")
                    results.append({"mode": "gate", "clients": threads, "keys": nkeys, "round": rnd,
                                    "tree": stack.label, "web_cpu_ms_per_job": 0.0, **figures})
                    print(f"  gate t={threads} k={nkeys} r={rnd} {stack.label:>6}: {figures['rps']:7.1f} submits/s  "
                          f"p50 {figures['p50_ms']:6.0f} ms  p95 {figures['p95_ms']:6.0f} ms", flush=True)
    return results


def summarize(results: list[dict], labels: list[str]) -> list[dict]:
    base, this = labels[0], labels[-1]
    levels = sorted({(r["mode"], r["clients"], r["keys"]) for r in results})
    summary = []
    for mode, clients, nkeys in levels:
        row: dict = {"mode": mode, "clients": clients, "keys": nkeys}
        for label in labels:
            runs = [r for r in results if (r["mode"], r["clients"], r["keys"], r["tree"]) == (mode, clients, nkeys, label)]
            row[label] = {"rps": median([r["rps"] for r in runs]), "p50_ms": median([r["p50_ms"] for r in runs]),
                          "p95_ms": median([r["p95_ms"] for r in runs]),
                          "web_cpu_ms_per_job": median([r["web_cpu_ms_per_job"] for r in runs]),
                          "errors": sum(sum(r["errors"].values()) for r in runs)}
        row["ratio_rps"] = row[this]["rps"] / row[base]["rps"] if row[base]["rps"] else None
        summary.append(row)
        print(f"{mode:>4} clients={clients:<3} keys={nkeys:<2} "
              + "  ".join(f"{label} {row[label]['rps']:.1f} req/s p50 {row[label]['p50_ms']:.0f} "
                          f"p95 {row[label]['p95_ms']:.0f} ms cpu {row[label]['web_cpu_ms_per_job']:.1f} ms/job"
                          for label in labels)
              + f"  ratio {row['ratio_rps']:.2f}", flush=True)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", help="LABEL=PATH, baseline first (default main=/work/main, this=.)")
    parser.add_argument("--model", default=str(REPO / "var/models/tiny"))
    parser.add_argument("--clients", default="8,32", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--keys", default="1,10", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--modes", default="web,full", type=lambda s: s.split(","))
    parser.add_argument("--processes", type=int, default=2, help="daphne processes per tree")
    parser.add_argument("--redis-port", type=int, default=6480)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL",
                                                                 "postgres://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--base-port", type=int, default=18480)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    trees = [t.split("=", 1) for t in (args.tree or ["main=/work/main", f"this={REPO}"])]
    log_dir = REPO / "var/log/submit_bench"
    log_dir.mkdir(parents=True, exist_ok=True)
    redis_proc = ensure_redis(args.redis_port, log_dir)
    stacks = [Stack(label, Path(path).resolve(), args.base_port + i, f"redis://127.0.0.1:{args.redis_port}/{i}",
                    fresh_database(args.database_url, f"submit_bench_{label}")) for i, (label, path) in enumerate(trees)]
    results: list[dict] = []
    try:
        for stack in stacks:
            import redis

            redis.Redis.from_url(stack.redis_url).flushdb()
            stack.start(model=Path(args.model).resolve(), processes=args.processes, keys=max(args.keys),
                        log_dir=log_dir)
        for mode in args.modes:
            results += run_mode(stacks, mode, args)
    finally:
        for stack in stacks:
            stack.stop()
        if redis_proc is not None:
            redis_proc.terminate()
    summary = summarize(results, [s.label for s in stacks])
    line = json.dumps({"bench": "submit_bench", "summary": summary, "runs": results,
                       "trees": {s.label: str(s.path) for s in stacks}, "seconds": args.seconds,
                       "rounds": args.rounds, "processes": args.processes})
    if args.out:
        Path(args.out).write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
