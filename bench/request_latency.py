"""Latency of one request at a time through the real web tier (diagnostics, not the issue's benchmark).

    python bench/request_latency.py [--web-processes 8] [--worker] [--calls 40] [--fsync-dir DIR]

Starts daphne (``inference_service.serve_web``) and, with ``--worker``, an engine worker, exactly
as ``service_bench.py`` does, then sends each request below ``--calls`` times, one at a time with
a pause between them, each on a new connection, and reports its p50 and min in ms: connect ->
the whole answer read. Requests: ``GET /api/v1/health``, an unknown URL (404), ``GET
/api/v1/jobs``, and ``POST /api/v1/jobs`` (4 tokens). With bench/trace_site on PYTHONPATH and
WORKER_TRACE_DIR set, the POSTs' marks inside daphne are summarised too (``web_stages_ms_p50``).

Below the web tier, the same database and Redis are timed from this process: a ``SELECT 1``
round trip, a committed one-row INSERT (the commit waits for the WAL flush, as the job's INSERT
does), a Redis PING, and, with ``--fsync-dir``, a 4 kB write + ``fsync`` in that folder (where
PostgreSQL keeps its WAL). Together they say whether an idle POST's time is CPU or waiting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import dump_json_line, ensure_default_model, environment  # noqa: E402
from service_bench import Service  # noqa: E402

WEB_MARKS = ("made", "app", "respond", "authed", "view", "tokenized", "rate", "inserted", "end")


async def _request(port: int, key: str, method: str, path: str, body: dict | None) -> tuple[float, bytes]:
    payload = json.dumps(body).encode() if body is not None else b""
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n")
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head.encode() + payload)
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    return 1000 * (time.perf_counter() - t0), answer.split(b" ", 2)[1]


CASES = {
    "health": ("GET", "/api/v1/health", None, b"200"),
    "not_found": ("GET", "/api/v1/no-such-thing", None, b"404"),
    "list_jobs": ("GET", "/api/v1/jobs", None, b"200"),
    "post_job": ("POST", "/api/v1/jobs", {"prompt": "The quick brown fox jumps over", "max_tokens": 4}, b"202"),
}


async def _time_requests(port: int, key: str, names: list[str], calls: int, pause_s: float) -> dict:
    out = {}
    for name in names:
        method, path, body, want = CASES[name]
        times = []
        for _ in range(calls):
            ms, status = await _request(port, key, method, path, body)
            if status != want:
                raise RuntimeError(f"{method} {path} answered {status!r}, expected {want!r}")
            times.append(ms)
            await asyncio.sleep(pause_s)
        out[name] = {"p50": round(statistics.median(times), 2), "min": round(min(times), 2),
                     "first_5": [round(t, 2) for t in times[:5]]}
    return out


def _time_backends(database_url: str, redis_url: str, calls: int, fsync_dir: str | None) -> dict:
    import psycopg
    import redis

    def p50(fn) -> dict:
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            times.append(1000 * (time.perf_counter() - t0))
            time.sleep(0.01)
        return {"p50": round(statistics.median(times), 3), "min": round(min(times), 3)}

    out = {}
    url = database_url.replace("postgres://", "postgresql://", 1)
    if url.startswith("postgresql://"):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TEMP TABLE latency_probe (n int)")
            out["pg_select_1"] = p50(lambda: conn.execute("SELECT 1").fetchone())
            # A temporary table's rows are not WAL-logged: commit a real one.
            conn.execute("CREATE TABLE IF NOT EXISTS bench_latency_probe (n int)")
            out["pg_insert_commit"] = p50(lambda: conn.execute("INSERT INTO bench_latency_probe VALUES (1)"))
            conn.execute("DROP TABLE bench_latency_probe")
            out["pg_synchronous_commit"] = conn.execute("SHOW synchronous_commit").fetchone()[0]
            out["pg_wal_sync_method"] = conn.execute("SHOW wal_sync_method").fetchone()[0]
    client = redis.Redis.from_url(redis_url)
    out["redis_ping"] = p50(client.ping)
    if fsync_dir:
        path = Path(fsync_dir) / f"fsync-probe-{os.getpid()}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            out["fsync_4k"] = p50(lambda: (os.write(fd, b"x" * 4096), os.fsync(fd)))
        finally:
            os.close(fd)
            path.unlink()
    return out


def _web_stages(trace_dir: str | None) -> dict:
    if not trace_dir:
        return {}
    posts = []
    for path in Path(trace_dir).glob("web-*.jsonl"):
        posts += [e for e in map(json.loads, path.open()) if e["k"] == "post" and e.get("made")]
    stages = {}
    for a, b in zip(WEB_MARKS, WEB_MARKS[1:], strict=False):
        spans = [1000 * (p[b] - p[a]) for p in posts if p.get(a) and p.get(b)]
        if spans:
            stages[f"{a}_to_{b}"] = round(statistics.median(spans), 2)
    return stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--web-processes", type=int, default=1)
    parser.add_argument("--worker", action="store_true", help="also run an engine worker (the POSTs' jobs then run)")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--requests", default=",".join(CASES), help=f"which, in this order (of {', '.join(CASES)})")
    parser.add_argument("--pause-ms", type=float, default=50.0, help="idle time between two requests")
    parser.add_argument("--fsync-dir", default=None, help="time a write + fsync in this folder too")
    parser.add_argument("--port", type=int, default=8056)
    parser.add_argument("--model", default=None)
    parser.add_argument("--out", default=None, help="also append the JSON line to this file")
    args = parser.parse_args()

    model = ensure_default_model(args.model).resolve()
    log_dir = Path(os.environ.get("BENCH_LOG_DIR", "/tmp"))
    service = Service(model, args.port, log_dir, web_processes=args.web_processes)
    key = service.start(with_worker=args.worker)[0]
    try:
        requests = asyncio.run(_time_requests(args.port, key, args.requests.split(","), args.calls, args.pause_ms / 1000))
    finally:
        service.stop()
    result = {
        "bench": "request_latency",
        "web_processes": args.web_processes,
        "worker": args.worker,
        "calls": args.calls,
        "requests_ms": requests,
        "backends_ms": _time_backends(service.env["DATABASE_URL"], service.env["REDIS_URL"], args.calls,
                                      args.fsync_dir),
        "web_stages_ms_p50": _web_stages(os.environ.get("WORKER_TRACE_DIR")),
        "env": environment(),
    }
    dump_json_line(result, args.out)


if __name__ == "__main__":
    main()
