"""Streaming bench: what following N job streams at once costs the web tier, this tree against
another (issue 43), and how every stream ends under load (issue 45 item 4).

Each tree (``--after``, default this one; ``--before``, default /work/main) runs as a service of
its own: a private ``redis-server`` (``--redis-port`` and the next port), a PostgreSQL database
(``stream_bench_<i>``; ``--database sqlite``: a SQLite file, where the local PostgreSQL is shared), daphne through ``inference_service.serve_web`` (``--web-processes``) and
one engine worker, all started from that tree's folder. A round opens ``--streams`` WebSockets
on ``/ws/v1/generate`` at once (submit and follow on one socket; each job runs exactly
``--max-tokens`` tokens, the end-of-sequence token banned), plus ``--rest-jobs`` jobs POSTed at
the same time and polled. The trees' rounds are interleaved (after, before, after, ...),
``--rounds`` each per level.

Per round: Redis commands (``INFO commandstats`` of that tree's private Redis, every command, and
XREAD alone) and the web tier's CPU seconds (launcher and daphne children, /proc), each per
streamed token; how each stream ended: ``final``, ``close <code>`` (a close frame, with the
error message if one came), ``dropped`` (the connection ended without a close frame: how many
deltas and seconds in) or ``timeout``. The summary gives medians per tree and level and the
ratios after / before; the LAST printed line is one JSON object.

    python bench/stream_bench.py --streams 128,300 --rounds 3 [--model PATH] [--out FILE]
    python bench/stream_bench.py --before '' --streams 300 --rest-jobs 300 --rounds 1   # load only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DEFAULT_MODEL, dump_json_line, environment, proc_cpu_ticks  # noqa: E402
from bench.http_clients import post_job  # noqa: E402

PG = "postgresql://postgres@127.0.0.1:5432"
SERVICE_ENV = {
    "DJANGO_SETTINGS_MODULE": "inference_service.settings",
    "DEFAULT_KEY_REQUESTS_PER_MINUTE": "1000000",
    "DEFAULT_KEY_MAX_CONCURRENT_JOBS": "2000",
    "DEFAULT_KEY_TOKENS_PER_DAY": "1000000000",
    "LOG_LEVEL": "WARNING",
    "PYTHONUNBUFFERED": "1",
    "OPENBLAS_NUM_THREADS": "1",
}


class Service:
    """One tree's service: its own redis-server, database, daphne launcher and engine worker."""

    def __init__(self, tree: Path, index: int, model: Path, redis_port: int, web_processes: int,
                 log_dir: Path, database: str = "postgres") -> None:
        self.tree, self.model, self.log_dir = tree, model, log_dir
        self.name = f"{index}-{tree.name}"
        self.redis_port = redis_port
        self.port = 18460 + index
        self.web_processes = web_processes
        db = f"stream_bench_{index}"
        url = f"{PG}/{db}" if database == "postgres" else f"sqlite:///{log_dir / db}.sqlite3"
        self.env = {**os.environ, **SERVICE_ENV, "DATABASE_URL": url,
                    "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0", "MODEL_PATH": str(model)}
        self.env.pop("PYTHONPATH", None)
        if os.environ.get("STREAM_BENCH_PYTHONPATH"):  # a diagnosis's sitecustomize, say
            self.env["PYTHONPATH"] = os.environ["STREAM_BENCH_PYTHONPATH"]
        self._db = db if database == "postgres" else None
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self) -> str:
        self._spawn("redis", ["redis-server", "--port", str(self.redis_port), "--save", "",
                              "--appendonly", "no", "--maxclients", "20000"])
        if self._db is not None:
            import psycopg

            with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self._db}" WITH (FORCE)')
                conn.execute(f'CREATE DATABASE "{self._db}"')
        self._wait(lambda: self.redis().ping(), "redis")
        self._manage("migrate", "--noinput")
        key = self._manage("create_api_user", "bench", "--quiet").strip().splitlines()[-1]
        py = sys.executable
        self._spawn("web", [py, "-m", "inference_service.serve_web", "-b", "127.0.0.1", "-p", str(self.port),
                            "--processes", str(self.web_processes)], {"DB_POOL": "1" if self._db else "0"})
        self._spawn("worker", [py, "manage.py", "run_engine_worker", "--worker-id", f"sb-{self.name}",
                               "--loglevel", "WARNING"], {"DB_POOL": "0"})
        self._wait(lambda: self.redis().exists(f"engine:workers:sb-{self.name}") and _port_open(self.port),
                   "the service")
        return key

    def redis(self):
        import redis

        return redis.Redis(port=self.redis_port, socket_timeout=5)

    def commands(self) -> dict[str, int]:
        stats = self.redis().info("commandstats")
        return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}

    def web_cpu_s(self) -> float:
        launcher = self.procs["web"].pid
        pids = [launcher, *_children(launcher)]
        return sum(_cpu_ticks(pid) for pid in pids) / os.sysconf("SC_CLK_TCK")

    def _wait(self, ready, what: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if ready():
                    return
            except Exception:  # not up yet
                pass
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: {what} did not start ({dead} exited); see {self.log_dir}")
            time.sleep(0.3)

    def _manage(self, *args: str) -> str:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=self.tree, env=self.env, check=True,
                              capture_output=True, text=True).stdout

    def _spawn(self, name: str, argv: list[str], extra: dict[str, str] | None = None) -> None:
        log = (self.log_dir / f"{self.name}-{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(argv, cwd=self.tree, env={**self.env, **(extra or {})},
                                            stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _cpu_ticks(pid: int) -> int:
    try:
        return proc_cpu_ticks(f"/proc/{pid}/stat")
    except OSError:
        return 0


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


# ------------------------------------------------------------------------------------ clients


async def one_stream(port: int, key: str, body: dict, timeout: float) -> dict:
    """Submit over /ws/v1/generate and read to the end: how it ended, deltas, tokens, seconds."""
    import websockets

    t0, deltas, tokens = time.perf_counter(), 0, 0
    error, port_used = None, None
    try:
        async with asyncio.timeout(timeout):
            async with websockets.connect(f"ws://127.0.0.1:{port}/ws/v1/generate?api_key={key}",
                                          open_timeout=timeout, max_queue=None) as ws:
                port_used = ws.local_address[1]
                await ws.send(json.dumps(body))
                async for raw in ws:
                    msg = json.loads(raw)
                    if msg["type"] == "delta":
                        deltas += 1
                    elif msg["type"] == "final":
                        tokens = msg["usage"]["completion_tokens"]
                        return {"end": "final", "deltas": deltas, "tokens": tokens, "s": time.perf_counter() - t0}
                    elif msg["type"] == "error":
                        error = msg.get("error", {}).get("code")
                code = ws.close_code
                rcvd = ws.close_rcvd
    except TimeoutError:
        return {"end": "timeout", "deltas": deltas, "tokens": 0, "s": time.perf_counter() - t0}
    except websockets.ConnectionClosed as exc:
        code, rcvd = exc.code, exc.rcvd
        error = error or (f"client sent {exc.sent.code} {exc.sent.reason}" if exc.sent else None)
    except (OSError, websockets.InvalidHandshake) as exc:  # refused, or cut before the handshake's answer
        return {"end": f"connect {exc.__class__.__name__}", "deltas": 0, "tokens": 0, "s": time.perf_counter() - t0}
    end = f"close {rcvd.code}" if rcvd is not None else f"dropped ({code})"
    end += f" {error}" if error else ""
    return {"end": end, "deltas": deltas, "tokens": 0, "s": time.perf_counter() - t0, "client_port": port_used,
            "at": time.time()}


async def one_rest_job(port: int, key: str, body: dict, timeout: float) -> str:
    job_id, _ = await post_job(port, key, body)
    return job_id


async def load_round(service: Service, key: str, streams: int, rest_jobs: int, max_tokens: int,
                     eos: int | None, timeout: float) -> dict:
    def body(i: int, tag: str) -> dict:
        out = {"prompt": f"{tag} {i}: once upon a time", "max_tokens": max_tokens, "temperature": 0.0}
        if eos is not None:
            out["logit_bias"] = {str(eos): -100}
        return out

    commands0, cpu0, t0 = service.commands(), service.web_cpu_s(), time.perf_counter()
    rest = [asyncio.create_task(one_rest_job(service.port, key, body(i, "rest"), timeout)) for i in range(rest_jobs)]
    ends = await asyncio.gather(*(one_stream(service.port, key, body(i, "ws"), timeout) for i in range(streams)))
    wall = time.perf_counter() - t0
    cpu, commands = service.web_cpu_s() - cpu0, service.commands()
    rest_ok = sum(1 for r in await asyncio.gather(*rest, return_exceptions=True) if isinstance(r, str))
    tokens = sum(e["tokens"] for e in ends) or 1
    calls = {name: n - commands0.get(name, 0) for name, n in commands.items()}
    outcome: dict[str, int] = {}
    for e in ends:
        outcome[e["end"]] = outcome.get(e["end"], 0) + 1
    return {
        "tree": service.name, "streams": streams, "rest_jobs": rest_jobs, "rest_ok": rest_ok, "wall_s": wall,
        "tokens": tokens, "web_cpu_s": cpu, "web_cpu_ms_per_token": 1000 * cpu / tokens,
        "redis_cmds_per_token": sum(calls.values()) / tokens, "xread_per_token": calls.get("xread", 0) / tokens,
        "outcome": outcome, "not_final": [e for e in ends if e["end"] != "final"][:20],
    }


def eos_token(model: Path) -> int | None:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model)).eos_token_id


def summarize(rounds: list[dict]) -> dict:
    out: dict = {}
    for r in rounds:
        out.setdefault(str(r["streams"]), {}).setdefault(r["tree"], []).append(r)
    summary: dict = {}
    for level, trees in out.items():
        med = {tree: {m: statistics.median(x[m] for x in rs)
                      for m in ("web_cpu_ms_per_token", "redis_cmds_per_token", "xread_per_token", "wall_s")}
               for tree, rs in trees.items()}
        summary[level] = {"median": med}
        names = list(med)
        if len(names) == 2:
            after, before = names
            summary[level]["after_over_before"] = {m: med[after][m] / med[before][m] if med[before][m] else None
                                                   for m in med[after]}
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--after", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--before", default="/work/main", help="'' to run only --after")
    parser.add_argument("--streams", default="128,300")
    parser.add_argument("--rest-jobs", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--web-processes", type=int, default=2)
    parser.add_argument("--redis-port", type=int, default=6460)
    parser.add_argument("--database", choices=("postgres", "sqlite"), default="postgres",
                        help="each tree's database: stream_bench_<i> on the local PostgreSQL, or a SQLite file")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--out", default=None, help="append the last line (JSON) to this file")
    args = parser.parse_args()
    model = Path(args.model).resolve()
    trees = [Path(args.after).resolve()] + ([Path(args.before).resolve()] if args.before else [])
    log_dir = Path(tempfile.mkdtemp(prefix="stream-bench-"))
    services = [Service(tree, i, model, args.redis_port + i, args.web_processes, log_dir, args.database)
                for i, tree in enumerate(trees)]
    eos = eos_token(model)
    rounds: list[dict] = []
    try:
        keys = [s.start() for s in services]
        for streams in [int(n) for n in args.streams.split(",")]:
            for _ in range(args.rounds):
                for service, key in zip(services, keys, strict=True):
                    r = asyncio.run(load_round(service, key, streams, args.rest_jobs, args.max_tokens, eos,
                                               args.timeout))
                    rounds.append(r)
                    print(json.dumps({k: v for k, v in r.items() if k != "not_final"}), flush=True)
                    for e in r["not_final"]:
                        print("  not final:", json.dumps(e), flush=True)
    finally:
        for s in services:
            s.stop()
    summary = summarize(rounds)
    for level, s in summary.items():
        print(f"{level} streams: {json.dumps(s)}")
    dump_json_line({"bench": "stream_bench", "args": vars(args), "summary": summary, "rounds": rounds,
                    "logs": str(log_dir), "environment": environment()}, args.out)


if __name__ == "__main__":
    main()
