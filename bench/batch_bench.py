"""Batch benchmark (issue 31): a batch of N requests against the same N requests sent online.

One run, on the real service (daphne, one engine worker, the light Celery worker and beat, Redis,
the database, as bench/service_bench.py starts them):

* **online**: the N requests (``POST /v1/completions``, streamed, greedy) sent by 32 concurrent
  clients, each taking the next request when its last one ends. Wall time: first request to the
  last ``[DONE]``.
* **batch**: the same N requests as a batch input file: upload, ``POST /v1/batches``, poll until
  it is ``completed``. Completion time: the upload's start to the status seen ``completed``.
  ``batch_over_online_time`` = batch completion time / online wall time (goal <= 1.05).
* **interactive**: one client's streamed requests, one after another, TTFT p50 while nothing else
  runs, then again while a second batch of the N requests runs (from its upload until it ends).
  ``interactive_ttft_ratio`` = the second / the first (goal <= 2.0).

The batch runs under the service's defaults (BATCH_JOBS_IN_FLIGHT_PER_KEY, BATCH_JOB_PRIORITY, the
engine's policy), which the environment of this script may change. The interactive client uses a
key of its own. Database and Redis as bench/service_bench.py (``BENCH_DATABASE_URL``,
``BENCH_REDIS_URL``; both emptied).

    python bench/batch_bench.py [--model PATH] [--lines 1000] [--clients 32] [--max-tokens 64]

The LAST printed line is one JSON object, with ``batch_over_online_time`` and
``interactive_ttft_ratio``. Smallest run (a check that it works): ``--lines 8 --clients 4 --max-tokens 8``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from common import dump_json_line, ensure_default_model, environment, percentile  # noqa: E402
from http_clients import openai_stream  # noqa: E402
from service_bench import Service  # noqa: E402

INTERACTIVE_MAX_TOKENS = 16
INTERACTIVE_PROMPT = "The quick brown fox"


class BatchService(Service):
    """The service of bench/service_bench.py with the light Celery worker and beat, which start,
    feed and end batches."""

    def start(self, with_worker: bool = True, keys: int = 1) -> list[str]:
        secrets = super().start(with_worker=with_worker, keys=keys)
        celery = [sys.executable, "-m", "celery", "-A", "inference_service"]
        self._spawn("light", [*celery, "worker", "-Q", "celery", "-P", "solo", "--loglevel", "WARNING",
                              "-n", f"light-{os.getpid()}@%h"])
        self._spawn("beat", [*celery, "beat", "--loglevel", "WARNING", "-s", str(self.log_dir / "celerybeat-schedule")])
        time.sleep(5)  # the light worker's start (it consumes once up)
        if any(p.poll() is not None for p in self.procs):  # a batch would wait for them forever
            raise RuntimeError(f"the light Celery worker or beat did not start; see {self.log_dir}")
        return secrets


def requests(n: int, max_tokens: int, model: str) -> list[dict]:
    return [{"model": model, "prompt": f"Story number {i}: once upon a time", "max_tokens": max_tokens,
             "temperature": 0.0} for i in range(n)]


async def online_round(port: int, key: str, bodies: list[dict], clients: int) -> float:
    """Wall seconds for ``bodies``, ``clients`` at a time, each client taking the next body."""
    queue: asyncio.Queue[dict] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait({**body, "stream": True})

    async def client() -> None:
        while not queue.empty():
            body = queue.get_nowait()
            await openai_stream(port, key, body, time.perf_counter())

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return time.perf_counter() - t0


async def interactive(port: int, key: str, model: str, stop: asyncio.Event | None, count: int
                      ) -> list[tuple[str, float]]:
    """(job id, TTFT seconds) of one client's requests, one after another: ``count`` of them, or
    (with ``stop``) until it is set."""
    ttft = []
    body = {"model": model, "prompt": INTERACTIVE_PROMPT, "max_tokens": INTERACTIVE_MAX_TOKENS, "temperature": 0.0,
            "stream": True}
    while (len(ttft) < count) if stop is None else not stop.is_set():
        job, first, _tokens = await openai_stream(port, key, body, time.perf_counter())
        ttft.append((job, first))
    return ttft


def run_batch(base_url: str, key: str, bodies: list[dict]) -> tuple[float, dict]:
    """Upload, create, poll until the batch ends: (seconds, the ended batch as a dict). Plain HTTP
    (the tests use the openai SDK; the GPU machine's bundle does not carry it)."""
    import httpx

    lines = "".join(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/completions", "body": body})
                    + "\n" for i, body in enumerate(bodies))
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=600) as client:
        t0 = time.perf_counter()
        file = client.post("/files", data={"purpose": "batch"},
                           files={"file": ("bench.jsonl", lines.encode(), "application/jsonl")})
        file.raise_for_status()
        batch = client.post("/batches", json={"input_file_id": file.json()["id"], "endpoint": "/v1/completions",
                                              "completion_window": "24h"})
        batch.raise_for_status()
        state = batch.json()
        while state["status"] not in ("completed", "failed", "expired", "cancelled"):
            time.sleep(0.05)
            reply = client.get(f"/batches/{state['id']}")
            reply.raise_for_status()
            state = reply.json()
    elapsed = time.perf_counter() - t0
    if state["status"] != "completed" or state["request_counts"]["completed"] != len(bodies):
        raise RuntimeError(f"the batch ended {state['status']}: {state['request_counts']}")
    return elapsed, state


async def batch_with_interactive(base_url: str, port: int, keys: list[str], bodies: list[dict],
                                 model: str) -> tuple[float, list[tuple[str, float]]]:
    stop = asyncio.Event()
    watcher = asyncio.create_task(interactive(port, keys[1], model, stop, 0))
    try:
        elapsed, _batch = await asyncio.to_thread(run_batch, base_url, keys[0], bodies)
    finally:
        stop.set()
    return elapsed, await watcher


def _stages(service: BatchService, requests: list[tuple[str, float]]) -> dict[str, float]:
    """p50 of the interactive jobs' INSERT -> claim and claim -> first token, from their rows."""
    stamps = service.job_timestamps([job for job, _ in requests])
    rows = [stamps[job] for job, _ in requests if job in stamps and None not in stamps[job][:3]]
    return {"insert_to_claim": round(1000 * percentile([s - c for c, s, _f, _e in rows], 50), 1),
            "claim_to_first_token": round(1000 * percentile([f - s for _c, s, f, _e in rows], 50), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--idle-requests", type=int, default=20, help="interactive requests measured while idle")
    parser.add_argument("--port", type=int, default=18766)
    parser.add_argument("--out", default=None, help="also append the final JSON line to this file")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    model_path = ensure_default_model(args.model).resolve()
    log_dir = ROOT / "var" / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    service = BatchService(model_path, args.port, log_dir)
    model = model_path.name
    bodies = requests(args.lines, args.max_tokens, model)
    base_url = f"http://127.0.0.1:{args.port}/v1"
    try:
        keys = service.start(keys=2)
        # Warm-up of both paths (the light worker loads the tokenizer at its first batch).
        asyncio.run(online_round(args.port, keys[0], bodies[:args.clients], args.clients))
        run_batch(base_url, keys[0], bodies[:args.clients])
        idle = asyncio.run(interactive(args.port, keys[1], model, None, args.idle_requests))
        online_s = asyncio.run(online_round(args.port, keys[0], bodies, args.clients))
        print(f"online: {online_s:.1f} s", flush=True)
        batch_s, batch = run_batch(base_url, keys[0], bodies)
        print(f"batch: {batch_s:.1f} s", flush=True)
        busy_batch_s, busy = asyncio.run(batch_with_interactive(base_url, args.port, keys, bodies, model))
        print(f"batch with an interactive client: {busy_batch_s:.1f} s, {len(busy)} interactive requests", flush=True)
        stages = {"idle": _stages(service, idle), "during_batch": _stages(service, busy)}
    finally:
        service.stop()

    idle_p50, busy_p50 = percentile([t for _, t in idle], 50), percentile([t for _, t in busy], 50)
    dump_json_line({
        "bench": "batch",
        "model": str(model_path),
        "lines": args.lines,
        "clients": args.clients,
        "max_tokens": args.max_tokens,
        "online_wall_s": round(online_s, 2),
        "batch_s": round(batch_s, 2),
        "batch_with_interactive_s": round(busy_batch_s, 2),
        "interactive_ttft_ms_p50_idle": round(1000 * idle_p50, 1),
        "interactive_ttft_ms_p50_during_batch": round(1000 * busy_p50, 1),
        "interactive_requests_during_batch": len(busy),
        "interactive_stages_ms_p50": stages,
        "settings": {name: os.environ.get(name) for name in ("BATCH_JOBS_IN_FLIGHT_PER_KEY", "BATCH_JOB_PRIORITY",
                                                             "ENGINE_POLICY") if os.environ.get(name)},
        "env": environment(),
        "batch_over_online_time": round(batch_s / online_s, 3),
        "interactive_ttft_ratio": round(busy_p50 / idle_p50, 3),
    }, args.out)


if __name__ == "__main__":
    main()
