"""One-token bench (issue 43): the job path's own rate, this tree against another (the tree
before a change), interleaved, in one run.

Each tree runs the whole service (web tier, one engine worker, its own database and Redis DB) from
its own checkout, both started before the first round. Then, ``--rounds`` times, for each tree in
turn: ``--clients`` clients, each sending one-token requests (``max_tokens=1``, the OpenAI
``POST /v1/completions`` without ``stream``: one HTTP request that submits and waits for the
answer) one after another for ``--seconds``. A request's latency is its request to its answer.
Any request that does not end with 200 is an error, and the run fails. With ``--drain-jobs N``
(default 256), each round also sends N one-token jobs straight to each tree's worker (rows
written and messages sent by ``manage.py shell``, no web tier) and times them until none is queued
or running: the worker's own rate (claim, engine, sink), apart from the web tier's.

    python bench/one_token_bench.py --before /work/main [--model PATH] [--clients 128] [--rounds 3]
        [--seconds 5] [--keys 1] [--redis-port 6470]

``--before``: the other checkout (its own ``.venv/bin/python`` unless ``--before-python``).
``--redis-port``: start a private ``redis-server`` on that port for both trees (DB 1 and 2); without
it, ``BENCH_REDIS_URL``'s server (default the local one) DBs 12 and 13. Databases: PostgreSQL
``one_token_before`` and ``one_token_after`` on ``BENCH_PG`` (default the local server), created
if missing and flushed. Prints one line per round, then the medians and the ratio after/before;
the LAST line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import dump_json_line, ensure_default_model, environment, median, percentile  # noqa: E402
from http_clients import openai_complete  # noqa: E402
from service_bench import Service  # noqa: E402

DRAIN_SCRIPT = """
import json, time
from django.contrib.auth.models import User
from api.models import Job, JobStatus
from api.jobs.services.dispatch import job_dispatch
from api.serving.catalog import model_queue
user, _ = User.objects.get_or_create(username="drain")
jobs = Job.objects.bulk_create([Job(owner=user, prompt="x", prompt_token_ids=[1, 2, 3, 4], dispatch_count=1,
                                    params={{"max_tokens": 1, "temperature": 0.0}}) for _ in range({n})])
queue = model_queue(jobs[0].model)
t0 = time.perf_counter()
for job in jobs:
    job_dispatch(job_id=str(job.id), queue=queue)
sent = time.perf_counter() - t0
ids = [job.id for job in jobs]
while Job.objects.filter(id__in=ids, status__in=[JobStatus.QUEUED, JobStatus.IN_PROGRESS]).exists():
    time.sleep(0.005)
wall = time.perf_counter() - t0
done = Job.objects.filter(id__in=ids, status=JobStatus.COMPLETED).count()
print(json.dumps({{"wall_s": wall, "send_s": sent, "completed": done}}))
"""


class TreeService(Service):
    """service_bench's Service, run from the checkout ``root`` with ``python``."""

    def __init__(self, model: Path, port: int, log_dir: Path, *, root: Path, python: str, database_url: str,
                 redis_url: str, name: str, web_processes: int) -> None:
        super().__init__(model, port, log_dir, web_processes=web_processes)
        self.root, self.python, self.name = root, python, name
        self.worker_id = f"bench-{name}-{os.getpid()}"
        self.env.update({"DATABASE_URL": database_url, "REDIS_URL": redis_url,
                         "DEFAULT_KEY_MAX_CONCURRENT_JOBS": "100000", "DEFAULT_KEY_TOKENS_PER_DAY": "1000000000"})

    def _manage(self, *args: str) -> str:
        return subprocess.run([self.python, "manage.py", *args], cwd=self.root, env=self.env, check=True,
                              capture_output=True, text=True).stdout

    def _spawn(self, name: str, argv: list[str], extra_env: dict[str, str] | None = None) -> None:
        log = (self.log_dir / f"one-token-{self.name}-{name}.log").open("wb")
        argv = [self.python if arg == sys.executable else arg for arg in argv]
        self.procs.append(subprocess.Popen(argv, cwd=self.root, env={**self.env, **(extra_env or {})}, stdout=log,
                                           stderr=subprocess.STDOUT))


def drain_round(service: TreeService, jobs: int) -> dict:
    """The worker alone: ``jobs`` one-token jobs written straight to the database and sent to the
    broker back to back (no web tier), timed from the first send until none is queued or running."""
    result = service.shell_json(DRAIN_SCRIPT.format(n=jobs))
    return {**result, "jobs_s": jobs / result["wall_s"], "errors": jobs - result["completed"]}


async def one_round(port: int, keys: list[str], *, clients: int, seconds: float, model: str) -> dict:
    """``clients`` clients send one-token requests back to back for ``seconds``; req/s over the
    wall time until the last answer."""
    latencies: list[float] = []
    errors: list[str] = []
    deadline = time.perf_counter() + seconds

    async def client(i: int) -> None:
        body = {"model": model, "prompt": f"Once upon a time {i}", "max_tokens": 1, "temperature": 0.0}
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                await openai_complete(port, keys[i % len(keys)], body)
            except Exception as exc:  # noqa: BLE001 - counted, and the run fails
                errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                await asyncio.sleep(0.1)  # a refused request must not spin
                continue
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    wall = time.perf_counter() - t0
    return {"req_s": len(latencies) / wall, "requests": len(latencies), "errors": len(errors),
            "first_errors": errors[:3], "p50_ms": 1000 * (percentile(latencies, 50) or 0.0),
            "p95_ms": 1000 * (percentile(latencies, 95) or 0.0), "wall_s": wall}


def _pg_database(name: str) -> str:
    import psycopg

    base = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    return f"{base.replace('postgresql://', 'postgres://')}/{name}"


def _redis_server(port: int, log_dir: Path) -> subprocess.Popen:
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                            stdout=(log_dir / "one-token-redis.log").open("wb"), stderr=subprocess.STDOUT)
    import redis

    deadline = time.monotonic() + 10
    while True:
        try:
            redis.Redis(port=port).ping()
            return proc
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the other checkout (the tree before the change)")
    parser.add_argument("--before-python", default=None)
    parser.add_argument("--model", default=None)
    parser.add_argument("--clients", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--keys", type=int, default=1, help="API keys (each of its own user) the clients take in turn")
    parser.add_argument("--port", type=int, default=18865, help="the first tree's port; the second's is the next")
    parser.add_argument("--redis-port", type=int, default=None)
    parser.add_argument("--web-processes", type=int, default=1)
    parser.add_argument("--drain-jobs", type=int, default=256,
                        help="per round and tree, also this many jobs sent to the worker without the web tier (0: none)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    model = ensure_default_model(args.model).resolve()
    log_dir = ROOT / "var" / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    before = Path(args.before).resolve()
    redis_proc = _redis_server(args.redis_port, log_dir) if args.redis_port else None
    redis_base = (f"redis://127.0.0.1:{args.redis_port}" if args.redis_port
                  else os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379"))
    trees = {
        "before": (before, args.before_python or str(before / ".venv" / "bin" / "python"),
                   2 if args.redis_port else 12),
        "after": (ROOT, sys.executable, 1 if args.redis_port else 13),
    }
    services = {name: TreeService(model, args.port + i, log_dir, root=root, python=python,
                                  database_url=_pg_database(f"one_token_{name}"), redis_url=f"{redis_base}/{db}",
                                  name=name, web_processes=args.web_processes)
                for i, (name, (root, python, db)) in enumerate(trees.items())}
    runs: dict[str, list[dict]] = {name: [] for name in services}
    drains: dict[str, list[dict]] = {name: [] for name in services}
    try:
        keys = {name: service.start(keys=args.keys) for name, service in services.items()}
        for name, service in services.items():  # warm-up: each path's first requests compile and connect
            asyncio.run(one_round(service.port, keys[name], clients=8, seconds=1.0, model=model.name))
        for i in range(args.rounds):
            for name, service in services.items():
                run = asyncio.run(one_round(service.port, keys[name], clients=args.clients, seconds=args.seconds,
                                            model=model.name))
                runs[name].append(run)
                print(f"round {i + 1} {name}: {run['req_s']:.1f} req/s, p50 {run['p50_ms']:.0f} ms, "
                      f"p95 {run['p95_ms']:.0f} ms, {run['errors']} errors {run['first_errors']}", flush=True)
            for name, service in services.items() if args.drain_jobs else ():
                drain = drain_round(service, args.drain_jobs)
                drains[name].append(drain)
                print(f"round {i + 1} {name} worker alone: {drain['jobs_s']:.1f} jobs/s ({args.drain_jobs} jobs, "
                      f"{drain['wall_s']:.2f} s, sent in {drain['send_s']:.2f} s), {drain['errors']} not completed",
                      flush=True)
    finally:
        for service in services.values():
            service.stop()
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait(10)

    summary = {name: {"req_s": round(median([r["req_s"] for r in rs]), 1),
                      "p50_ms": round(median([r["p50_ms"] for r in rs]), 1),
                      "p95_ms": round(median([r["p95_ms"] for r in rs]), 1),
                      "errors": sum(r["errors"] for r in rs), "rounds": [round(r["req_s"], 1) for r in rs]}
               for name, rs in runs.items()}
    ratio = summary["after"]["req_s"] / max(summary["before"]["req_s"], 1e-9)
    if args.drain_jobs:
        for name, ds in drains.items():
            summary[name]["worker_jobs_s"] = round(median([d["jobs_s"] for d in ds]), 1)
            summary[name]["worker_rounds"] = [round(d["jobs_s"], 1) for d in ds]
            summary[name]["errors"] += sum(d["errors"] for d in ds)
        worker_ratio = summary["after"]["worker_jobs_s"] / max(summary["before"]["worker_jobs_s"], 1e-9)
        summary["ratio_worker_jobs_s"] = round(worker_ratio, 3)
        print(f"worker alone jobs/s: after {summary['after']['worker_jobs_s']} / before "
              f"{summary['before']['worker_jobs_s']} = {worker_ratio:.2f}x", flush=True)
    print(f"one-token req/s: after {summary['after']['req_s']} / before {summary['before']['req_s']} = {ratio:.2f}x; "
          f"p95 {summary['after']['p95_ms']} vs {summary['before']['p95_ms']} ms", flush=True)
    dump_json_line({"bench": "one_token", "clients": args.clients, "rounds": args.rounds, "seconds": args.seconds,
                    "keys": args.keys, "model": str(model), "before": str(before), "ratio_req_s": round(ratio, 3),
                    **summary, "environment": environment()}, args.out)
    if any(s["errors"] for s in summary.values() if isinstance(s, dict)):
        sys.exit(1)


if __name__ == "__main__":
    main()
