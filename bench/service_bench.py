"""Service benchmark (issue 4): the whole service end to end vs an in-process EngineCore.

Same model, same 32 prompts, 128 new tokens each, greedy, in one run:

* **engine**: ``EngineCore`` in this process, all requests submitted at once (``add_request`` +
  ``stream_outputs``). TTFT = submit -> first output with a token.
* **service**: real daphne + one engine worker subprocess (``manage.py run_engine_worker``) +
  Redis + the database. Each client POSTs ``/api/v1/jobs``, then streams the job over
  ``/ws/v1/jobs/<id>/`` until its final message, all 32 at once. TTFT = start of the POST ->
  first delta on the socket.

Aggregate tok/s = all completion tokens / wall time from the first submit to the last final.
The REST API has no ``ignore_eos``, so the prompts are chosen (from a deterministic pool cut from
the repository's corpus) among those whose greedy continuation runs the full 128 tokens in the
engine: both sides then generate exactly the same tokens. Runs alternate engine, service,
engine, service... (``--repeats``); the report gives medians of tok/s and TTFT p50 over all
requests of all repeats.

Both sides run with the same BLAS threads: the worker inherits ``OPENBLAS_NUM_THREADS`` from
this process (``BENCH_SERVICE_OPENBLAS_THREADS`` overrides it). On a small shared machine run
with ``OPENBLAS_NUM_THREADS=1``: OpenBLAS threads spin while they wait, and on 2 cores shared
with daphne, Redis and Postgres a second one costs the service several times its CPU time.

Database: ``BENCH_DATABASE_URL`` (default: a ``service_bench`` database on the local PostgreSQL,
created if missing). daphne runs with ``DB_POOL=1`` (psycopg's connection pool) when
``psycopg_pool`` is importable, as ``scripts/run.sh`` does; ``BENCH_DB_POOL=0|1`` forces it.
Redis: ``BENCH_REDIS_URL`` (default DB 11 of the local Redis; flushed).

    python bench/service_bench.py [--model PATH] [--concurrency 32] [--max-tokens 128] [--repeats 2]

The LAST printed line is one JSON object, with ``service_over_engine`` and ``added_ttft_ms_p50``.
``service.stages_ms_p50`` splits the REST jobs' TTFT by the rows' timestamps: POST start -> INSERT
-> the worker's claim -> the engine's first token -> the first delta at the client;
``service.client_send_ms_p50`` is POST start -> the request written to the socket (this client's
own delay: its POSTs run on its event loop, one connection each).

``--openai`` also runs each repeat's jobs through the OpenAI-compatible ``POST /v1/completions``
with ``stream`` (one HTTP request that submits and streams; ``openai_over_engine``,
``added_ttft_ms_p50_openai``, and ``service_openai.stages_ms_p50`` from those jobs' rows);
``--ws-submit`` through ``/ws/v1/generate``.

``service.cpu_s`` is the CPU time (user + system) of the web tier (the launcher and its daphne
processes) and of the engine worker (one process) per round, and of this client.

Smallest run (a check that it works, not a figure):
``python bench/service_bench.py --concurrency 2 --max-tokens 8 --repeats 1``.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from common import dump_json_line, ensure_default_model, environment, median, percentile, proc_cpu_ticks  # noqa: E402
from http_clients import openai_stream, post_job  # noqa: E402

from engine_worker.common.config import EngineConfig  # noqa: E402
from engine_worker.common.request import SamplingParams  # noqa: E402
from engine_worker.engine_core import EngineCore  # noqa: E402
from engine_worker.runner.loader import load_model  # noqa: E402  (the worker's loader: same dtype)


def candidate_prompts(tokenizer, n: int) -> list[str]:
    """A deterministic pool of text prompts (lines of the shipped corpus, 20-80 words)."""
    from demo_model.builder import CORPUS_PATH

    words = CORPUS_PATH.read_text(encoding="utf-8")[:300_000].split()
    out = []
    for i in range(n):
        start = (i * 7919) % (len(words) - 100)
        out.append(" ".join(words[start : start + 20 + (i * 13) % 60]))
    return out


# ------------------------------------------------------------------------------------- engine


async def engine_round(engine: EngineCore, prompts: list[list[int]], max_tokens: int) -> dict:
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    ttft: list[float] = []
    tokens: list[int] = []
    decode: list[float] = []

    async def one(i: int, prompt: list[int]) -> None:
        t0 = time.perf_counter()
        rid = await engine.add_request(prompt, sp, request_id=f"bench-{time.time_ns()}-{i}")
        first = None
        async for out in engine.stream_outputs(rid):
            if first is None and out.completion_tokens:
                first = time.perf_counter() - t0
            if out.finished:
                tokens.append(out.completion_tokens)
                decode.append(time.perf_counter() - t0 - (first or 0.0))
        ttft.append(first or 0.0)

    t0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    wall = time.perf_counter() - t0
    return {"tok_s": sum(tokens) / wall, "ttft_s": ttft, "tokens": tokens, "wall_s": wall,
            "first_token_to_final_s": decode,
            "cpu_s": {"engine_process": round(time.process_time() - cpu0, 2)}}


# ------------------------------------------------------------------------------------ service


class Service:
    """daphne and (unless started without) one engine worker as subprocesses on a fresh DB/Redis."""

    def __init__(self, model: Path, port: int, log_dir: Path, web_processes: int = 1) -> None:
        self.port = port
        self.log_dir = log_dir
        self.env = dict(os.environ)
        self.env.update({
            "DATABASE_URL": os.environ.get("BENCH_DATABASE_URL") or _postgres_bench_db(),
            "REDIS_URL": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/11"),
            "MODEL_PATH": str(model),
            "DJANGO_SETTINGS_MODULE": "inference_service.settings",
            "DEFAULT_KEY_REQUESTS_PER_MINUTE": "100000",
            "LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
        })
        # Same BLAS threads as the in-process engine unless told otherwise (apples to apples).
        if os.environ.get("BENCH_SERVICE_OPENBLAS_THREADS"):
            self.env["OPENBLAS_NUM_THREADS"] = os.environ["BENCH_SERVICE_OPENBLAS_THREADS"]
        self.procs: list[subprocess.Popen] = []
        self.web_processes = web_processes
        self.worker_id = f"bench-{os.getpid()}"

    def start(self, with_worker: bool = True, keys: int = 1) -> list[str]:
        """Start the web tier (and, unless ``with_worker`` is False, the engine worker) on a
        flushed database and Redis; returns ``keys`` new API keys, each of its own user."""
        import redis

        redis.Redis.from_url(self.env["REDIS_URL"]).flushdb()
        self._manage("migrate", "--noinput")
        # A fresh database: jobs an earlier run (or anything else) left queued would be claimed
        # and run by this run's worker, and skew it.
        self._manage("flush", "--noinput")
        secrets = [self._manage("create_api_user", f"bench{i or ''}", "--quiet").strip().splitlines()[-1]
                   for i in range(keys)]
        py = sys.executable
        # daphne borrows database connections from psycopg's pool (DB_POOL, as deployed) when
        # psycopg[pool] is installed; the worker keeps its persistent connections.
        self._spawn("daphne", [py, "-m", "inference_service.serve_web", "-b", "127.0.0.1", "-p", str(self.port),
                               "--processes", str(self.web_processes)], {"DB_POOL": _db_pool()})
        if with_worker:
            self._spawn("worker", [py, "manage.py", "run_engine_worker", "--worker-id", self.worker_id,
                                   "--loglevel", "WARNING"], {"DB_POOL": "0"})
        r = redis.Redis.from_url(self.env["REDIS_URL"])
        deadline = time.monotonic() + 300
        while not ((not with_worker or r.exists(f"engine:workers:{self.worker_id}")) and _port_open(self.port)):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"service did not start; see {self.log_dir}")
            time.sleep(0.2)
        self.check_alone(r)
        return secrets

    def check_alone(self, r) -> None:
        """Refuse to measure when another engine worker consumes this Redis DB (a leftover of an
        interrupted run, say): it would take some of the jobs, and with another model or load
        turn a run into nonsense."""
        time.sleep(2.5)  # a heartbeat period (WORKER_HEARTBEAT_S, 2 s): a live worker re-publishes after the flush
        others = sorted(k.decode() for k in r.keys("engine:workers:*") if k.decode() != f"engine:workers:{self.worker_id}")
        if others:
            raise RuntimeError(f"other engine workers consume {self.env['REDIS_URL']}: {others}; stop them first")

    def job_timestamps(self, job_ids: list[str]) -> dict[str, list[float | None]]:
        """created_at, started_at, first_token_at, finished_at of each job, as Unix times."""
        script = (
            "import json, sys; from api.models import Job; "
            f"ids = {json.dumps(job_ids)}; "
            "ts = lambda d: d.timestamp() if d else None; "
            "print(json.dumps({str(j.id): [ts(j.created_at), ts(j.started_at), ts(j.first_token_at), "
            "ts(j.finished_at)] for j in Job.objects.filter(id__in=ids)}))"
        )
        return self.shell_json(script)

    def shell_json(self, script: str) -> Any:
        """What ``script``, run by ``manage.py shell`` on the service's settings, prints last, as JSON."""
        return json.loads(self._manage("shell", "-c", script).strip().splitlines()[-1])

    def _manage(self, *args: str) -> str:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, check=True,
                              capture_output=True, text=True).stdout

    def _spawn(self, name: str, argv: list[str], extra_env: dict[str, str] | None = None) -> None:
        log = (self.log_dir / f"service-bench-{name}.log").open("wb")
        env = {**self.env, **(extra_env or {})}
        self.procs.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) the web tier (the launcher and its daphne children) and the
        engine worker (one process, all of its threads) have used so far (Linux /proc)."""
        tick = os.sysconf("SC_CLK_TCK")
        out = {}
        for name, proc in zip(("daphne", "worker"), self.procs, strict=False):
            pids = [proc.pid, *_children(proc.pid)] if name == "daphne" else [proc.pid]
            out[name] = sum(_cpu_ticks(pid) for pid in pids) / tick
        return out

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()


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


def _db_pool() -> str:
    """DB_POOL for daphne: BENCH_DB_POOL if set, else on when psycopg_pool is importable."""
    if os.environ.get("BENCH_DB_POOL"):
        return os.environ["BENCH_DB_POOL"]
    try:
        import psycopg_pool  # noqa: F401
    except ImportError:
        return "0"
    return "1"


def _postgres_bench_db() -> str:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = 'service_bench'").fetchone():
            conn.execute("CREATE DATABASE service_bench")
    return "postgres://postgres@127.0.0.1:5432/service_bench"


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


async def service_round(port: int, keys: list[str], prompts: list[str], max_tokens: int) -> dict:
    """Every prompt POSTed and streamed at once, the i-th with key ``keys[i % len(keys)]``."""
    import websockets

    ttft: list[float] = []
    tokens: list[int] = []
    post: list[float] = []
    sent: list[float] = []
    ws_open: list[float] = []
    ws_close: list[float] = []

    traces: list[tuple[str, float, float, float]] = []

    async def one(prompt: str, key: str) -> None:
        t0, t0_wall = time.perf_counter(), time.time()
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
        job_id, t_sent = await post_job(port, key, body)
        post.append(time.perf_counter() - t0)
        sent.append(t_sent - t0)
        url = f"ws://127.0.0.1:{port}/ws/v1/jobs/{job_id}/?api_key={key}"
        t_open = time.perf_counter()
        async with websockets.connect(url, open_timeout=120) as ws:
            ws_open.append(time.perf_counter() - t_open)
            first, completion = await _read_stream(ws, t0)
            final = time.perf_counter() - t0
        # The round's wall (and tok/s) ends with the closing handshakes; the final's arrival is
        # what the stages use, and ws_close is the difference.
        ws_close.append(time.perf_counter() - t0 - final)
        ttft.append(first)
        tokens.append(completion)
        # Wall clock: the database's timestamps are too.
        traces.append((job_id, t0_wall, t0_wall + first, t0_wall + final))

    result = await _round(one, prompts, keys, ttft, tokens, post_s=post, client_send_s=sent, ws_open_s=ws_open,
                          ws_close_s=ws_close)
    result["traces"] = traces
    return result


STAGES = ("submit_to_insert", "insert_to_claim", "claim_to_first_token", "first_token_to_client")
# After the first token: the worker's decoding (first_token_at -> finished_at, both set by its
# output path) and the final's way to the client. Compare the first with the engine's
# first_token_to_final.
TAIL_STAGES = ("first_token_to_finished", "finished_to_client_final")


def stage_times(traces: list[tuple[str, float, float, float]],
                stamps: dict[str, list[float | None]]) -> dict[str, list[float]]:
    """Each REST job's path in seconds, from the client's clock and the row's timestamps (same
    host, same wall clock): POST start -> the row's created_at (set in the view, just before the
    INSERT) -> started_at (the worker's claim) -> first_token_at (the engine's first token) -> the
    first delta at the client; and first_token_at -> finished_at -> the final at the client."""
    out: dict[str, list[float]] = {name: [] for name in STAGES + TAIL_STAGES}
    for job_id, t0, client_first, client_final in traces:
        created, started, first_token, finished = stamps.get(job_id) or (None, None, None, None)
        if None in (created, started, first_token, finished):
            continue
        points = (t0, created, started, first_token, client_first)
        for name, a, b in zip(STAGES, points, points[1:], strict=False):
            out[name].append(b - a)
        out["first_token_to_finished"].append(finished - first_token)
        out["finished_to_client_final"].append(client_final - finished)
    return out


async def _round(one, prompts: list[str], keys: list[str], ttft: list[float], tokens: list[int],
                 **extra: list[float]) -> dict:
    """Run ``one(prompt, key)`` for every prompt at once, the keys taken in turn; tok/s over the
    wall time of the whole round (``one`` fills ``ttft``, ``tokens`` and the lists in ``extra``)."""
    t0 = time.perf_counter()
    await asyncio.gather(*(one(p, keys[i % len(keys)]) for i, p in enumerate(prompts)))
    wall = time.perf_counter() - t0
    return {"tok_s": sum(tokens) / wall, "ttft_s": ttft, "tokens": tokens, "wall_s": wall, **extra}


async def _read_stream(ws, t0: float) -> tuple[float, int]:
    """Read a job's messages until its final: (seconds from ``t0`` to the first delta, completion
    tokens of the final)."""
    first = None
    async for raw in ws:
        msg = json.loads(raw)
        if msg["type"] == "delta" and first is None:
            first = time.perf_counter() - t0
        elif msg["type"] == "final":
            return first or 0.0, msg["usage"]["completion_tokens"]
        elif msg["type"] == "error":
            raise RuntimeError(msg)
    raise RuntimeError("the stream closed before its final message")


async def ws_submit_round(port: int, keys: list[str], prompts: list[str], max_tokens: int) -> dict:
    """The same jobs submitted over ``/ws/v1/generate`` (submit and stream on one socket, no
    HTTP request cycle). TTFT = start of the WebSocket connect -> first delta."""
    import websockets

    ttft: list[float] = []
    tokens: list[int] = []

    async def one(prompt: str, key: str) -> None:
        t0 = time.perf_counter()
        async with websockets.connect(f"ws://127.0.0.1:{port}/ws/v1/generate?api_key={key}", open_timeout=120) as ws:
            await ws.send(json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}))
            first, completion = await _read_stream(ws, t0)
        ttft.append(first)
        tokens.append(completion)

    return await _round(one, prompts, keys, ttft, tokens)


async def openai_round(port: int, keys: list[str], prompts: list[str], max_tokens: int, *, model: str) -> dict:
    """The same jobs through the OpenAI-compatible ``POST /v1/completions`` with ``stream``: submit
    and stream in one HTTP request. TTFT = start of the request -> first chunk with text."""
    ttft: list[float] = []
    tokens: list[int] = []
    traces: list[tuple[str, float, float, float]] = []

    async def one(prompt: str, key: str) -> None:
        t0, t0_wall = time.perf_counter(), time.time()
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "stream": True, "stream_options": {"include_usage": True}}
        job_id, first, completion = await openai_stream(port, key, body, t0)
        final = time.perf_counter() - t0
        ttft.append(first)
        tokens.append(completion)
        traces.append((job_id, t0_wall, t0_wall + first, t0_wall + final))  # as service_round's

    result = await _round(one, prompts, keys, ttft, tokens)
    result["traces"] = traces
    return result


# --------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--port", type=int, default=18765)
    parser.add_argument("--ws-submit", action="store_true",
                        help="also run each repeat's jobs through /ws/v1/generate (submit on the socket)")
    parser.add_argument("--openai", action="store_true",
                        help="also run each repeat's jobs through the OpenAI-compatible POST /v1/completions (streamed)")
    parser.add_argument("--out", default=None, help="also append the final JSON line to this file")
    parser.add_argument("--web-processes", type=int, default=int(os.environ.get("BENCH_WEB_PROCESSES", "1")),
                        help="daphne processes (inference_service.serve_web); default BENCH_WEB_PROCESSES or 1")
    parser.add_argument("--keys", type=int, default=int(os.environ.get("BENCH_KEYS", "1")),
                        help="API keys, each of its own user, that the jobs take in turn (default BENCH_KEYS "
                             "or 1: the issue's figures are one key's burst, whose submissions share its quota lock)")
    args = parser.parse_args()
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints where a slow run is
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still stop the services on SIGTERM

    model_path = ensure_default_model(args.model).resolve()  # the worker subprocess gets MODEL_PATH
    model, tokenizer = load_model(model_path)
    engine = EngineCore(model, tokenizer, EngineConfig.from_env())
    engine.start()
    log_dir = ROOT / "var" / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    service = Service(model_path, args.port, log_dir, web_processes=args.web_processes)
    try:
        texts, prompt_ids = full_length_prompts(engine, tokenizer, args.concurrency, args.max_tokens)

        keys = service.start(keys=args.keys)
        # Warm-up with all the prompts (8 tokens each): the engine side is warm from the probe
        # (its prefix cache holds these prompts), so the worker gets the same start.
        asyncio.run(service_round(args.port, keys, texts, 8))
        engine_runs, service_runs, ws_runs, openai_runs = [], [], [], []
        for _ in range(args.repeats):
            engine_runs.append(asyncio.run(engine_round(engine, prompt_ids, args.max_tokens)))
            before, client_before = service.cpu_seconds(), time.process_time()
            service_runs.append(asyncio.run(service_round(args.port, keys, texts, args.max_tokens)))
            after = service.cpu_seconds()
            service_runs[-1]["cpu_s"] = {k: round(after[k] - before[k], 2) for k in after}
            service_runs[-1]["cpu_s"]["bench_client"] = round(time.process_time() - client_before, 2)
            if args.ws_submit:
                ws_runs.append(asyncio.run(ws_submit_round(args.port, keys, texts, args.max_tokens)))
            if args.openai:
                openai_runs.append(asyncio.run(openai_round(args.port, keys, texts, args.max_tokens,
                                                            model=model_path.name)))
            print(f"engine {engine_runs[-1]['tok_s']:.0f} tok/s, service {service_runs[-1]['tok_s']:.0f} tok/s",
                  flush=True)
        traces = [t for run in service_runs for t in run.pop("traces")]
        stages = stage_times(traces, service.job_timestamps([t[0] for t in traces]))
        openai_traces = [t for run in openai_runs for t in run.pop("traces")]
        openai_stages = stage_times(openai_traces, service.job_timestamps([t[0] for t in openai_traces]))
    finally:
        service.stop()
        engine.stop()
        engine.close()

    result = _report(engine_runs, service_runs, ws_runs, openai_runs, args, model_path)
    result["service"]["stages_ms_p50"] = {name: round(1000 * percentile(v, 50), 1) for name, v in stages.items() if v}
    if openai_runs:  # the same stages for the OpenAI path's jobs (their request is the submit)
        result["service_openai"]["stages_ms_p50"] = {
            name: round(1000 * percentile(v, 50), 1) for name, v in openai_stages.items() if v}
    dump_json_line(result, args.out)


def full_length_prompts(engine: EngineCore, tokenizer, n: int, max_tokens: int) -> tuple[list[str], list[list[int]]]:
    """``n`` prompts (texts and token ids) whose greedy continuation is never cut short by EOS
    (see the docstring), topped up with the longest ones if too few are; probing them also warms
    ``engine`` up."""
    pool = candidate_prompts(tokenizer, n * 4)
    ids = [tokenizer.encode(p) for p in pool]
    probe = asyncio.run(_probe(engine, ids, max_tokens))
    chosen = [i for i, count in enumerate(probe) if count == max_tokens][:n]
    if len(chosen) < n:
        rest = sorted(set(range(len(pool))) - set(chosen), key=lambda i: -probe[i])
        chosen += rest[: n - len(chosen)]
    return [pool[i] for i in chosen], [ids[i] for i in chosen]


async def _probe(engine: EngineCore, prompts: list[list[int]], max_tokens: int) -> list[int]:
    """Completion tokens of each prompt, greedy (also warms the engine up)."""
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    outs = await asyncio.gather(*(engine.generate(p, sp) for p in prompts))
    return [o.completion_tokens for o in outs]


def _report(engine_runs: list[dict], service_runs: list[dict], ws_runs: list[dict], openai_runs: list[dict], args,
            model_path: Path) -> dict:
    def summary(runs: list[dict]) -> dict:
        ttft = [t for r in runs for t in r["ttft_s"]]
        return {"tok_s": round(median([r["tok_s"] for r in runs]), 1),
                "wall_s": [round(r["wall_s"], 2) for r in runs],
                "cpu_s": [r["cpu_s"] for r in runs if "cpu_s" in r],
                "ttft_ms_p50": round(1000 * percentile(ttft, 50), 1),
                "ttft_ms_p90": round(1000 * percentile(ttft, 90), 1),
                "tokens_per_run": sum(runs[0]["tokens"]),
                **{f"{name}_ms_p50": round(1000 * percentile([t for r in runs for t in r[f"{name}_s"]], 50), 1)
                   for name in ("post", "client_send", "ws_open", "ws_close", "first_token_to_final") if f"{name}_s" in runs[0]},
                "runs_tok_s": [round(r["tok_s"], 1) for r in runs]}

    eng, svc = summary(engine_runs), summary(service_runs)
    extra = {}
    if ws_runs:
        ws_svc = summary(ws_runs)
        extra = {"service_ws_submit": ws_svc,
              "ws_submit_over_engine": round(ws_svc["tok_s"] / eng["tok_s"], 3),
              "added_ttft_ms_p50_ws_submit": round(ws_svc["ttft_ms_p50"] - eng["ttft_ms_p50"], 1)}
    if openai_runs:
        openai = summary(openai_runs)
        extra.update({"service_openai": openai,
                   "openai_over_engine": round(openai["tok_s"] / eng["tok_s"], 3),
                   "added_ttft_ms_p50_openai": round(openai["ttft_ms_p50"] - eng["ttft_ms_p50"], 1)})
    return {
        "bench": "service",
        "model": str(model_path),
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "web_processes": args.web_processes,
        "keys": args.keys,
        "engine": eng,
        "service": svc,
        "service_over_engine": round(svc["tok_s"] / eng["tok_s"], 3),
        "added_ttft_ms_p50": round(svc["ttft_ms_p50"] - eng["ttft_ms_p50"], 1),
        **extra,
        "env": environment(),
    }


if __name__ == "__main__":
    main()
