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
bursts; the last line is JSON.

Uses the service benchmark's databases: BENCH_DATABASE_URL (default: PostgreSQL's
``service_bench`` on 127.0.0.1) and BENCH_REDIS_URL (default redis://127.0.0.1:6379/11), which it
flushes. Environment settings (``JOB_DISPATCH_THREAD=1``, say) reach the web processes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, dump_json_line, ensure_default_model, environment  # noqa: E402
from service_bench import _children, _cpu_ticks, _db_pool, _port_open, _post_job, _postgres_bench_db  # noqa: E402

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

    env = {
        **os.environ,
        "DATABASE_URL": os.environ.get("BENCH_DATABASE_URL") or _postgres_bench_db(),
        "REDIS_URL": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/11"),
        "MODEL_PATH": str(ensure_default_model(os.environ.get("MODEL_PATH")).resolve()),
        "DJANGO_SETTINGS_MODULE": "inference_service.settings",
        "DEFAULT_KEY_REQUESTS_PER_MINUTE": "1000000",
        "LOG_LEVEL": "WARNING",
    }
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "REDIS_URL", "MODEL_PATH", "DJANGO_SETTINGS_MODULE")})
    import django

    django.setup()
    import redis

    from api.models import Job

    def manage(*argv: str) -> str:
        return subprocess.run([sys.executable, "manage.py", *argv], cwd=REPO, env=env, check=True,
                              capture_output=True, text=True).stdout

    broker = redis.Redis.from_url(env["REDIS_URL"])
    broker.flushdb()
    manage("migrate", "--noinput")
    manage("flush", "--noinput")
    key = manage("create_api_user", "webcpu", "--quiet").strip().splitlines()[-1]
    web = subprocess.Popen([sys.executable, "-m", "inference_service.serve_web", "-b", "127.0.0.1", "-p", str(args.port),
                            "--processes", str(args.processes)], cwd=REPO, env={**env, "DB_POOL": _db_pool()},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not _port_open(args.port):
            if time.monotonic() > deadline or web.poll() is not None:
                raise RuntimeError("serve_web did not start")
            time.sleep(0.2)
        time.sleep(2.0)  # the children warm up before they serve (WEB_WARM_UP)
        body = {"prompt": PROMPT, "max_tokens": 64, "temperature": 0.0}
        walls, cpu_ticks, posts = [], 0, 0
        for i in range(args.warm_up + args.bursts):
            before = _web_ticks(web.pid)
            t0 = time.perf_counter()
            asyncio.run(_burst(args.port, key, body, args.burst_size))
            wall = time.perf_counter() - t0
            time.sleep(0.3)  # the answers are out; let a dispatcher thread finish its sends
            after = _web_ticks(web.pid)
            Job.objects.all().delete()
            broker.flushdb()
            if i >= args.warm_up:
                walls.append(wall)
                cpu_ticks += after - before
                posts += args.burst_size
    finally:
        web.terminate()
        web.wait(30)
    tick = os.sysconf("SC_CLK_TCK")
    result = {
        "bench": "web_post_cpu",
        "burst_size": args.burst_size,
        "bursts": args.bursts,
        "processes": args.processes,
        "cpu_ms_per_post": round(1000 * cpu_ticks / tick / posts, 3),
        "burst_wall_ms_p50": round(1000 * statistics.median(walls), 1),
        "env_settings": {k: os.environ[k] for k in ("JOB_DISPATCH_THREAD", "WEB_REQUEST_THREADS") if k in os.environ},
        "env": environment(),
    }
    print(f"web CPU per POST {result['cpu_ms_per_post']:.3f} ms, burst wall p50 {result['burst_wall_ms_p50']} ms")
    dump_json_line(result, args.out)


async def _burst(port: int, key: str, body: dict, n: int) -> None:
    await asyncio.gather(*(_post_job(port, key, body) for _ in range(n)))


def _web_ticks(launcher: int) -> int:
    """CPU ticks of the web launcher and its daphne children so far."""
    return sum(_cpu_ticks(pid) for pid in [launcher, *_children(launcher)])


if __name__ == "__main__":
    main()
