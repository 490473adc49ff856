"""Prefix-affinity routing against the plain shared queue: prefix-cache hit rate and TTFT.

The whole service (daphne, Redis, the database, as bench/service_bench.py starts them) with
``--workers`` (2) engine workers of one model and ``--web-processes`` daphne processes (as
deployed: serve_web's default, one per core up to 4). ``--conversations`` (64) conversations of
``--turns`` (4) turns each run at once; every conversation's prompt starts with the same system
prompt of ``--system-tokens`` (1,000) tokens, and each turn's prompt is the previous turn's
prompt, its answer and one more question (lines of the shipped corpus, at most
``--question-words`` words). A conversation sends its next turn when the previous
one's final arrives (POST /api/v1/jobs, then its WebSocket to the final).

It runs twice on a fresh service (fresh workers, so no prefix cache carries over): with
``ROUTING_AFFINITY`` on (the default) and off (every job on the model's shared queue). Each run
first warms its workers with ``--warmup-conversations`` (4) conversations of the same shape over
another system prompt, not counted. Per run, over the timed conversations:

* **hit rate**: the prompt tokens the workers' prefix caches supplied over all prompt tokens
  (``usage.cached_tokens`` / ``usage.prompt_tokens`` of every job, from GET /api/v1/jobs/<id>);
* **TTFT p50/p90**: from the POST being written to the first delta on the job's socket;
* **later turns on the first turn's worker**: how well the conversations kept their worker.

With ``--rounds N`` the modes run N times, interleaved (machines vary from run to run). The LAST
printed line is one JSON object with each mode's median ``hit_rate_*`` and ``ttft_p50_ms_*``,
``ttft_speedup`` (shared TTFT p50 / affinity TTFT p50, of the medians) and its value per round, and
each run's figures.

    python bench/affinity_bench.py [--model PATH] [--workers 2] [--conversations 64] [--turns 4]
        [--system-tokens 1000] [--max-tokens 32] [--question-words 24] [--rounds 1] [--web-processes N]

Small, on a CPU: ``--conversations 8 --turns 3 --system-tokens 300 --max-tokens 8``.

Under bench/probes (``PYTHONPATH=bench/probes TTFT_PROBE=/tmp/ttft/p LOCK_PROBE=/tmp/lock``), each
run writes its own probe files, ``<prefix>.<mode><round>`` (``/tmp/ttft/p.affinity1``), and on SQLite
its own database, ``<TTFT_PROBE>.<mode><round>.sqlite3``, for ``bench/ttft_phases.py`` and
``bench/probes/probe_write_lock.py`` to read one run at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from common import dump_json_line, ensure_default_model, environment, percentile  # noqa: E402
from http_clients import get_json, post_job  # noqa: E402
from service_bench import Service, _read_stream, candidate_prompts  # noqa: E402

from inference_service.serve_web import default_processes  # noqa: E402

# bench/probes/sitecustomize.py's variables: each names a probe's output prefix.
PROBES = ("STEP_PROBE", "TTFT_PROBE", "LOCK_PROBE")


def system_prompt(model_path: Path, tokens: int, part: int = 0) -> str:
    """Text of about ``tokens`` tokens of the model's tokenizer: the ``part``-th run of that many
    tokens of the shipped corpus (part 1 shares no prefix with part 0)."""
    from transformers import AutoTokenizer

    from demo_model.builder import CORPUS_PATH

    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    ids = tokenizer.encode(CORPUS_PATH.read_text(encoding="utf-8")[: tokens * 16 * (part + 1)])
    return tokenizer.decode(ids[part * tokens:(part + 1) * tokens], skip_special_tokens=True)


async def conversation(port: int, key: str, system: str, questions: list[str], max_tokens: int) -> list[dict]:
    """Run one conversation's turns in order; per turn its job id and TTFT."""
    import websockets

    turns, history = [], system
    for question in questions:
        prompt = f"{history}\nQ: {question}\nA:"
        job_id, sent = await post_job(port, key, {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0})
        async with websockets.connect(f"ws://127.0.0.1:{port}/ws/v1/jobs/{job_id}/?api_key={key}",
                                      open_timeout=120, max_size=None) as ws:
            ttft, _tokens = await _read_stream(ws, sent)
        answer = (await get_json(port, key, f"/api/v1/jobs/{job_id}"))["output_text"]
        turns.append({"job_id": job_id, "ttft_s": ttft})
        history = f"{prompt}{answer}"
    return turns


async def _jobs(port: int, key: str, job_ids: list[str]) -> list[dict]:
    """GET /api/v1/jobs/<id> of each job, in order."""
    return [await get_json(port, key, f"/api/v1/jobs/{job_id}") for job_id in job_ids]


def start_workers(service: Service, count: int) -> list[str]:
    """Start ``count`` engine workers of the service's model and wait for their heartbeats."""
    import redis

    ids = [f"affinity-w{i}-{os.getpid()}" for i in range(count)]
    for worker_id in ids:
        log = (service.log_dir / f"affinity-bench-{worker_id}.log").open("wb")
        service.procs.append(subprocess.Popen(
            [sys.executable, "manage.py", "run_engine_worker", "--worker-id", worker_id, "--loglevel", "WARNING"],
            cwd=ROOT, env={**service.env, "DB_POOL": "0"}, stdout=log, stderr=subprocess.STDOUT))
    r = redis.Redis.from_url(service.env["REDIS_URL"])
    deadline = time.monotonic() + 600
    while not all(r.exists(f"engine:workers:{w}") for w in ids):
        if time.monotonic() > deadline or any(p.poll() is not None for p in service.procs):
            raise RuntimeError(f"the engine workers did not start; see {service.log_dir}/affinity-bench-*.log")
        time.sleep(0.5)
    return ids


def run(args, model_path: Path, system: str, warmup_system: str, *, affinity: bool, tag: str) -> dict:
    log_dir = ROOT / "var" / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    service = Service(model_path, args.port, log_dir, web_processes=args.web_processes)
    jobs = args.conversations * args.turns
    service.env.update({"ROUTING_AFFINITY": "1" if affinity else "0",
                        "DEFAULT_KEY_MAX_CONCURRENT_JOBS": str(10 * jobs), "DEFAULT_KEY_TOKENS_PER_DAY": str(10**12)})
    service.env.update(_probes_of_run(tag, service.env["DATABASE_URL"]))
    questions = [" ".join(q.split()[: args.question_words]) for q in candidate_prompts(None, jobs)]
    try:
        (key,) = service.start(with_worker=False)
        workers = start_workers(service, args.workers)
        time.sleep(2.5)  # a heartbeat period: the web tier sees every worker live before the first job

        async def all_conversations(prompt: str, count: int) -> list[list[dict]]:
            return await asyncio.gather(*(
                conversation(args.port, key, prompt, questions[c * args.turns:(c + 1) * args.turns], args.max_tokens)
                for c in range(count)))

        # Warm-up over another system prompt, the same shapes: each mode starts with its workers'
        # kernels compiled (mlx compiles GPU kernels at first use) and nothing of ``system`` cached.
        if args.warmup_conversations:
            asyncio.run(all_conversations(warmup_system, args.warmup_conversations))
        t0 = time.perf_counter()
        conversations = asyncio.run(all_conversations(system, args.conversations))
        wall = time.perf_counter() - t0
        rows = [{**turn, "conversation": c, "turn": t} for c, turns in enumerate(conversations) for t, turn in enumerate(turns)]
        for row, job in zip(rows, asyncio.run(_jobs(args.port, key, [r["job_id"] for r in rows])), strict=True):
            row.update(_usage(job))
        stamps = service.job_timestamps([r["job_id"] for r in rows])
        routed = _routed_workers(service, [r["job_id"] for r in rows])
        for r in rows:
            created, started, first, _finished = stamps[r["job_id"]]
            r["wait_s"], r["prefill_s"] = started - created, first - started
            r["routed_worker"] = routed.get(r["job_id"])
    finally:
        service.stop()
    return _summary(rows, wall, workers, affinity=affinity)


def _probes_of_run(tag: str, database_url: str) -> dict[str, str]:
    """Each run's own files for the probes of bench/probes that are on (``<prefix>.<tag>``, e.g.
    ``/tmp/ttft/p.shared2``) and, on SQLite, its own database beside them, so that
    ``bench/ttft_phases.py <prefix>.<tag> --db <prefix>.<tag>.sqlite3`` and
    ``probe_write_lock.py <prefix>.<tag>`` read one mode's run alone."""
    env = {name: f"{os.environ[name]}.{tag}" for name in PROBES if os.environ.get(name)}
    if env.get("TTFT_PROBE") and database_url.startswith("sqlite:"):
        env["DATABASE_URL"] = f"sqlite:///{env['TTFT_PROBE']}.sqlite3"
    return env


def _routed_workers(service: Service, job_ids: list[str]) -> dict[str, str | None]:
    """The worker routing chose for each job (None: the model's shared queue)."""
    script = ("import json; from api.models import Job; "
              f"print(json.dumps({{str(i): w for i, w in Job.objects.filter(id__in={json.dumps(job_ids)})"
              ".values_list('id', 'routed_worker')}))")
    return service.shell_json(script)


def _usage(job: dict) -> dict:
    return {"prompt_tokens": job["usage"]["prompt_tokens"], "cached_tokens": job["usage"]["cached_tokens"],
            "worker_id": job["worker_id"], "status": job["status"]}


def _summary(rows: list[dict], wall: float, workers: list[str], *, affinity: bool) -> dict:
    def hit_rate(selected: list[dict]) -> float:
        prompt = sum(r["prompt_tokens"] for r in selected)
        return round(sum(r["cached_tokens"] for r in selected) / prompt, 4) if prompt else 0.0

    ttfts = [r["ttft_s"] * 1000 for r in rows]
    return {
        "routing": "affinity" if affinity else "shared",
        "jobs": len(rows),
        "completed": sum(r["status"] == "completed" for r in rows),
        "hit_rate": hit_rate(rows),
        "hit_rate_later_turns": hit_rate([r for r in rows if r["turn"] > 0]),
        "hit_rate_by_turn": [hit_rate([r for r in rows if r["turn"] == t]) for t in range(1 + max(r["turn"] for r in rows))],
        "ttft_p50_ms": round(percentile(ttfts, 50), 1),
        "ttft_p90_ms": round(percentile(ttfts, 90), 1),
        # TTFT's parts on the service's clock: created to claimed (queue), claimed to first token.
        "queue_wait_p50_ms": round(percentile([r["wait_s"] * 1000 for r in rows], 50), 1),
        "claim_to_first_token_p50_ms": round(percentile([r["prefill_s"] * 1000 for r in rows], 50), 1),
        "wall_s": round(wall, 2),
        "jobs_per_worker": {w: sum(r["worker_id"] == w for r in rows) for w in workers},
        "later_turns_on_first_turns_worker": round(_kept(rows), 4),
        # Where routing sent the later turns: to the worker that ran the turn before (a recognised
        # continuation kept), to another worker (the load check), or to the shared queue.
        "later_turns_routed": _later_routes(rows),
        # Where routing sent the first turns (None: the shared queue): how evenly new conversations
        # were spread before affinity keeps each on its worker.
        "first_turns_routed": {str(w): sum(r["routed_worker"] == w for r in rows if r["turn"] == 0)
                               for w in [*workers, None]},
    }


def _later_routes(rows: list[dict]) -> dict[str, int]:
    previous = {(r["conversation"], r["turn"]): r["worker_id"] for r in rows}
    counts = {"previous_worker": 0, "other_worker": 0, "shared_queue": 0}
    for r in rows:
        if r["turn"] > 0:
            routed = r["routed_worker"]
            key = ("shared_queue" if routed is None else
                   "previous_worker" if routed == previous[(r["conversation"], r["turn"] - 1)] else "other_worker")
            counts[key] += 1
    return counts


def _kept(rows: list[dict]) -> float:
    """The share of later turns that ran on the worker of their conversation's first turn."""
    first, later = {}, []
    for r in rows:
        if r["turn"] == 0:
            first[r["conversation"]] = r["worker_id"]
        else:
            later.append(r)
    return sum(r["worker_id"] == first[r["conversation"]] for r in later) / len(later) if later else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--question-words", type=int, default=24, help="at most this many words per user turn")
    parser.add_argument("--modes", nargs="+", choices=("affinity", "shared"), default=["affinity", "shared"],
                        help="the runs, in order (one alone: its figures, no ratio)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeats of --modes, interleaved; the summary gives the medians over rounds")
    parser.add_argument("--warmup-conversations", type=int, default=4,
                        help="conversations over another system prompt before each mode's timed run")
    parser.add_argument("--web-processes", type=int, default=default_processes(),
                        help="daphne processes (serve_web --processes); default as deployed, one per core up to 4")
    parser.add_argument("--port", type=int, default=18767)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    model_path = ensure_default_model(args.model).resolve()
    system = system_prompt(model_path, args.system_tokens)
    warmup_system = system_prompt(model_path, args.system_tokens, part=1)
    results: dict[str, list[dict]] = {}
    for round_index in range(1, args.rounds + 1):
        for mode in args.modes:
            results.setdefault(mode, []).append(run(args, model_path, system, warmup_system,
                                                    affinity=mode == "affinity", tag=f"{mode}{round_index}"))
            print(json.dumps(results[mode][-1]), flush=True)
    dump_json_line({**_medians(results), "args": vars(args), "model": str(model_path), "runs": results,
                    "environment": environment()}, args.out)


def _medians(results: dict[str, list[dict]]) -> dict:
    """Each mode's hit rate and TTFT p50 as medians over its rounds, and shared / affinity TTFT p50
    (``ttft_speedup``: of the medians, and per round where both modes ran)."""
    def median_of(mode: str, key: str) -> float | None:
        return statistics.median(r[key] for r in results[mode]) if mode in results else None

    out = {f"{key}_{mode}": median_of(mode, key) for mode in ("affinity", "shared") for key in ("hit_rate", "ttft_p50_ms")}
    both = "affinity" in results and "shared" in results
    out["ttft_speedup"] = (round(out["ttft_p50_ms_shared"] / out["ttft_p50_ms_affinity"], 3)
                           if both and out["ttft_p50_ms_affinity"] else None)
    # The i-th run of each mode (a mode named twice in --modes has more runs: its extra ones go unpaired).
    out["ttft_speedup_per_round"] = ([round(s["ttft_p50_ms"] / a["ttft_p50_ms"], 3)
                                      for a, s in zip(results["affinity"], results["shared"], strict=False) if a["ttft_p50_ms"]]
                                     if both else [])
    return out


if __name__ == "__main__":
    main()
