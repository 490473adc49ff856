"""The web tier's CPU per ``POST /api/v1/jobs``: bursts of submissions against ``serve_web``, with
no engine worker (diagnostics of the web side of bench/service_bench.py; not the issue's benchmark).

    python bench/web_post_cpu.py [--bursts 30] [--burst-size 32] [--processes 1]

On the GPU host a burst's INSERTs wait mostly for the web processes' CPU (each POST took ~5-6 ms
of a request thread's CPU there, docs/benchmarks.md, twelfth pass), so the CPU one POST costs is
what moves POST -> INSERT. CPU time is also far steadier than wall time on a shared machine, so
two trees or settings can be compared on the dev VM: run this script in each, alternately, and
compare ``cpu_ms_per_post``. Each burst sends ``--burst-size`` POSTs at once (one connection
each, as the service benchmark's client does); its jobs are deleted before the next burst (no
worker takes them). The daphne processes' CPU (user + system, /proc) is summed over the measured
bursts, and the Celery messages each burst became are counted on the engine queue; the last line
is JSON.

Uses the service benchmark's databases: BENCH_DATABASE_URL (default: PostgreSQL's
``service_bench`` on 127.0.0.1) and BENCH_REDIS_URL (default redis://127.0.0.1:6379/11), which it
flushes. Environment settings (``DB_POOL=1``, say) reach the web processes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, dump_json_line, ensure_default_model, environment  # noqa: E402
from http_clients import post_job  # noqa: E402
from service_bench import Service  # noqa: E402

PROMPT = "Summarise the following notes for a colleague who missed the meeting: " * 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bursts", type=int, default=30)
    parser.add_argument("--warm-up", type=int, default=3, help="bursts before the measured ones")
    parser.add_argument("--burst-size", type=int, default=32)
    parser.add_argument("--processes", type=int, default=1, help="daphne processes (serve_web)")
    parser.add_argument("--port", type=int, default=18790)
    parser.add_argument("--out", default=None, help="also append the final JSON line to this file")
    args = parser.parse_args()

    model = ensure_default_model(os.environ.get("MODEL_PATH")).resolve()
    log_dir = REPO / "var" / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    service = Service(model, args.port, log_dir, web_processes=args.processes)
    # This process deletes each burst's jobs through the ORM, on the service's database.
    os.environ.update({k: service.env[k] for k in ("DATABASE_URL", "REDIS_URL", "MODEL_PATH", "DJANGO_SETTINGS_MODULE")})
    import django

    django.setup()
    import redis

    from api.models import Job
    from api.tasks import ENGINE_QUEUE

    broker = redis.Redis.from_url(service.env["REDIS_URL"])
    try:
        key = service.start(with_worker=False)[0]  # no worker: its check_alone wait also lets daphne warm up
        body = {"prompt": PROMPT, "max_tokens": 64, "temperature": 0.0}
        walls, messages, cpu_s, posts = [], [], 0.0, 0
        for i in range(args.warm_up + args.bursts):
            before = service.cpu_seconds()["daphne"]
            t0 = time.perf_counter()
            asyncio.run(_burst(args.port, key, body, args.burst_size))
            wall = time.perf_counter() - t0
            time.sleep(0.3)  # the answers are out; let the last sends reach the broker
            after = service.cpu_seconds()["daphne"]
            queued_messages = broker.llen(ENGINE_QUEUE)  # no worker consumes them
            Job.objects.all().delete()
            broker.flushdb()
            if i >= args.warm_up:
                walls.append(wall)
                messages.append(queued_messages)
                cpu_s += after - before
                posts += args.burst_size
    finally:
        service.stop()
    result = {
        "bench": "web_post_cpu",
        "burst_size": args.burst_size,
        "bursts": args.bursts,
        "processes": args.processes,
        "cpu_ms_per_post": round(1000 * cpu_s / posts, 3),
        "burst_wall_ms_p50": round(1000 * statistics.median(walls), 1),
        # Celery messages a burst became (one per job).
        "engine_messages_per_burst_p50": statistics.median(messages),
        "env_settings": {k: os.environ[k] for k in ("DB_POOL",) if k in os.environ},
        "env": environment(),
    }
    print(f"web CPU per POST {result['cpu_ms_per_post']:.3f} ms, burst wall p50 {result['burst_wall_ms_p50']} ms, "
          f"{result['engine_messages_per_burst_p50']} engine messages per burst")
    dump_json_line(result, args.out)


async def _burst(port: int, key: str, body: dict, n: int) -> None:
    await asyncio.gather(*(post_job(port, key, body) for _ in range(n)))


if __name__ == "__main__":
    main()
