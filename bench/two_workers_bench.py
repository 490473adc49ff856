"""Two engine workers on one device, each within its memory budget (issue 33's goal).

The whole service (daphne, Redis, the database, as bench/service_bench.py starts them) with
``--workers`` (2) engine workers of the same model, each started with
``ENGINE_GPU_MEMORY_UTILIZATION=--share`` (0.3) and ``ENGINE_COMPLETION_BATCH_SIZE=--clients``
(128). Every round, ``workers x clients`` jobs are POSTed to ``/api/v1/jobs`` at once and streamed
over their WebSockets to the final; ``--rounds`` (10) rounds.

It drives the service through its public surface only: HTTP, WebSockets, the environment, and
``GET /metrics`` (``METRICS_TOKEN``), scraped every ``--sample-s`` (0.5) s for each worker's
memory (``inference_worker_memory_bytes``: active, peak, cache, budget and its parts). On CUDA it
also samples ``nvidia-smi``'s memory per process (each worker's process and its children).

A worker is **within its budget** when the most its mlx allocator can have held stayed at or below
its budget: the largest of live arrays plus kept freed buffers seen, and mlx's peak of live arrays
since the worker started plus the most freed buffers seen; on CUDA ``nvidia_within_budget`` says
the same of nvidia-smi's figure, which also counts the CUDA context. **No OOM**: every job completed, no worker process exited, and no worker logged
an out-of-memory step. Each worker's completed jobs (``worker_id`` in ``GET /api/v1/jobs``) show
how the load split between them.

The LAST printed line is one JSON object: per worker its budget, peaks and samples, per round the
tokens/s, and ``all_within_budget``, ``no_oom``.

    python bench/two_workers_bench.py [--model PATH] [--workers 2] [--share 0.3] [--clients 128] [--rounds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from common import dump_json_line, ensure_default_model  # noqa: E402
from http_clients import post_job  # noqa: E402
from service_bench import Service, _children, candidate_prompts  # noqa: E402

MIB = 1 << 20
# The worker's own log line for a step that ran out of device memory (engine_worker/sched/preemption.py).
OOM_LOG = "the device ran out of memory"
METRIC = re.compile(r'^inference_worker_memory_bytes\{kind="(\w+)",worker="([^"]+)"\} ([0-9.e+]+)$')


class MemoryWatch(threading.Thread):
    """Samples /metrics (and nvidia-smi on CUDA) until stopped; keeps each worker's maxima."""

    def __init__(self, port: int, token: str, worker_pids: dict[str, int], every_s: float) -> None:
        super().__init__(daemon=True)
        self.port, self.token, self.worker_pids, self.every_s = port, token, worker_pids, every_s
        self.maxima: dict[str, dict[str, float]] = {w: {} for w in worker_pids}
        self.samples = 0
        self._done = threading.Event()
        self.nvidia = shutil.which("nvidia-smi") is not None

    def run(self) -> None:
        while not self._done.is_set():
            self.sample()
            self._done.wait(self.every_s)

    def stop(self) -> None:
        self._done.set()
        self.join(10)
        self.sample()

    def sample(self) -> None:
        figures = self._metrics()
        for worker, kinds in figures.items():
            top = self.maxima.setdefault(worker, {})
            kinds["footprint"] = kinds.get("active", 0) + kinds.get("cache", 0)
            for kind, value in kinds.items():
                top[kind] = max(top.get(kind, 0), value)
        for worker, used in self._nvidia().items():
            top = self.maxima.setdefault(worker, {})
            top["nvidia_smi"] = max(top.get("nvidia_smi", 0), used)
        self.samples += 1

    def _metrics(self) -> dict[str, dict[str, float]]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/metrics",
                                         headers={"Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                text = response.read().decode()
        except OSError:
            return {}
        out: dict[str, dict[str, float]] = {}
        for line in text.splitlines():
            match = METRIC.match(line)
            if match:
                kind, worker, value = match.groups()
                out.setdefault(worker, {})[kind] = float(value)
        return out

    def _nvidia(self) -> dict[str, float]:
        """Bytes nvidia-smi reports per worker (its process and its children)."""
        if not self.nvidia:
            return {}
        try:
            rows = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return {}
        by_pid = {}
        for row in rows.splitlines():
            pid, _, used = row.partition(",")
            if pid.strip().isdigit() and used.strip().isdigit():
                by_pid[int(pid)] = int(used) * MIB
        return {worker: sum(by_pid.get(p, 0) for p in [pid, *_children(pid)])
                for worker, pid in self.worker_pids.items()}


async def one_job(port: int, key: str, prompt: str, max_tokens: int) -> tuple[str, int]:
    """POST a job and stream it to its final: (finish reason, completion tokens)."""
    import websockets

    job_id, _ = await post_job(port, key, {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0})
    async with websockets.connect(f"ws://127.0.0.1:{port}/ws/v1/jobs/{job_id}/?api_key={key}",
                                  open_timeout=120) as ws:
        async for raw in ws:
            msg = json.loads(raw)
            if msg["type"] == "final":
                return msg.get("finish_reason") or "?", msg["usage"]["completion_tokens"]
            if msg["type"] == "error":
                return f"error: {msg['error'].get('code')}", 0
    return "closed", 0


async def one_round(port: int, key: str, prompts: list[str], max_tokens: int) -> dict:
    t0 = time.perf_counter()
    results = await asyncio.gather(*(one_job(port, key, p, max_tokens) for p in prompts), return_exceptions=True)
    wall = time.perf_counter() - t0
    reasons: dict[str, int] = {}
    tokens = 0
    for r in results:
        reason = f"exception: {type(r).__name__}" if isinstance(r, BaseException) else r[0]
        reasons[reason] = reasons.get(reason, 0) + 1
        tokens += 0 if isinstance(r, BaseException) else r[1]
    return {"tok_s": round(tokens / wall, 1), "wall_s": round(wall, 2), "tokens": tokens, "finish_reasons": reasons}


def jobs_per_worker(port: int, key: str) -> dict[str, int]:
    """Completed jobs by the worker that ran them (``worker_id`` of ``GET /api/v1/jobs``)."""
    counts: dict[str, int] = {}
    url: str | None = f"http://127.0.0.1:{port}/api/v1/jobs?status=completed&page_size=100"
    while url:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            page = json.loads(response.read())
        for job in page["results"]:
            counts[job["worker_id"]] = counts.get(job["worker_id"], 0) + 1
        url = page.get("next")
    return counts


def start_workers(service: Service, args, model_path: Path) -> dict[str, subprocess.Popen]:
    """Start the engine workers (``manage.py run_engine_worker``, configured by environment)."""
    workers = {}
    for i in range(args.workers):
        worker_id = f"budget-w{i}-{os.getpid()}"
        env = {**service.env, "WORKER_ID": worker_id, "ENGINE_GPU_MEMORY_UTILIZATION": str(args.share),
               "ENGINE_COMPLETION_BATCH_SIZE": str(args.clients), "DB_POOL": "0"}
        log = (service.log_dir / f"two-workers-{worker_id}.log").open("wb")
        proc = subprocess.Popen([sys.executable, "manage.py", "run_engine_worker", "--loglevel", "WARNING"],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        service.procs.append(proc)  # stopped with the service
        workers[worker_id] = proc
    return workers


def wait_for_workers(watch: MemoryWatch, workers: dict[str, subprocess.Popen], timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(w in watch._metrics() for w in workers):
        if time.monotonic() > deadline or any(p.poll() is not None for p in workers.values()):
            raise RuntimeError("the engine workers did not start; see var/log/two-workers-*.log")
        time.sleep(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--share", type=float, default=0.3, help="each worker's ENGINE_GPU_MEMORY_UTILIZATION")
    parser.add_argument("--clients", type=int, default=128, help="clients per worker (and its completion batch)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--sample-s", type=float, default=0.5)
    parser.add_argument("--port", type=int, default=18766)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    model_path = ensure_default_model(args.model).resolve()
    log_dir = ROOT / "var" / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    service = Service(model_path, args.port, log_dir)
    token = secrets.token_hex(16)
    n_jobs = args.workers * args.clients
    service.env.update({"METRICS_TOKEN": token, "DEFAULT_KEY_MAX_CONCURRENT_JOBS": str(10 * n_jobs),
                        "DEFAULT_KEY_TOKENS_PER_DAY": str(10**12)})
    prompts = candidate_prompts(None, n_jobs)
    rounds: list[dict] = []
    try:
        (key,) = service.start(with_worker=False)
        workers = start_workers(service, args, model_path)
        watch = MemoryWatch(args.port, token, {w: p.pid for w, p in workers.items()}, args.sample_s)
        wait_for_workers(watch, workers)
        asyncio.run(one_round(args.port, key, prompts[: 2 * args.workers], 8))  # warm-up
        watch.start()
        for r in range(args.rounds):
            rounds.append(asyncio.run(one_round(args.port, key, prompts, args.max_tokens)))
            print(f"round {r}: {rounds[-1]['tok_s']:.0f} tok/s {rounds[-1]['finish_reasons']}", flush=True)
        watch.stop()
        exited = {w: p.poll() for w, p in workers.items() if p.poll() is not None}
        served = jobs_per_worker(args.port, key)
    finally:
        service.stop()
    dump_json_line(_report(args, model_path, watch, rounds, exited, served, log_dir), args.out)


def _report(args, model_path: Path, watch: MemoryWatch, rounds: list[dict], exited: dict, served: dict[str, int],
            log_dir: Path) -> dict:
    per_worker = {}
    for worker, top in sorted(watch.maxima.items()):
        budget = top.get("budget", 0)
        held = max(top.get("footprint", 0), top.get("peak", 0) + top.get("cache", 0))
        oom_lines = sum(line.count(OOM_LOG) for line in
                        (log_dir / f"two-workers-{worker}.log").read_text(errors="replace").splitlines())
        row = {"jobs_completed": served.get(worker, 0), "budget_mib": round(budget / MIB), "held_mib": round(held / MIB),
               "within_budget": 0 < held <= budget, "out_of_memory_steps": oom_lines,
               "max_mib": {k: round(v / MIB, 1) for k, v in sorted(top.items())}}
        if "nvidia_smi" in top:
            row["nvidia_within_budget"] = top["nvidia_smi"] <= budget
        per_worker[worker] = row
    failed = sum(n for r in rounds for reason, n in r["finish_reasons"].items() if reason not in ("length", "stop"))
    return {
        "bench": "two_workers",
        "model": str(model_path),
        "workers": args.workers,
        "share": args.share,
        "clients_per_worker": args.clients,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "samples": watch.samples,
        "per_worker": per_worker,
        "rounds_tok_s": [r["tok_s"] for r in rounds],
        "jobs_not_completed": failed,
        "workers_exited": exited,
        "all_within_budget": bool(per_worker) and all(w["within_budget"] for w in per_worker.values()),
        "no_oom": failed == 0 and not exited and all(w["out_of_memory_steps"] == 0 for w in per_worker.values()),
    }


if __name__ == "__main__":
    main()
