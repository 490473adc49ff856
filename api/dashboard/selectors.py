"""The engine dashboard's data: workers, their running requests and caches, throughput, and the
charts' history (the workers' recent heartbeats)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import redis

from api.common.redis_keys import WORKER_HISTORY_S
from api.jobs.selectors import job_status_counts, job_throughput
from api.serving.worker_history import recent_rate, worker_history
from api.serving.workers import worker_list

# The per-request fields of the seed's Scheduler.get_running_requests_info().
REQUEST_FIELDS = (
    "request_id", "status", "phase", "elapsed_s", "prompt_tokens", "completion_tokens", "max_tokens",
    "progress", "tokens_per_second", "ttft_s", "cache_hit_type", "cached_tokens",
)


def engine_overview(*, since: float | None = None) -> dict[str, Any]:
    """A JSON-ready snapshot for the dashboard, with the charts' samples taken after ``since``
    (all of the last ``WORKER_HISTORY_S`` seconds without it: a page that polls asks only for
    what it lacks). Redis being down is shown, not raised."""
    now = time.time()
    try:
        workers = worker_list()
        history = worker_history(worker_ids=[w.worker_id for w in workers], now=now)
        redis_error = None
    except redis.RedisError as exc:
        workers, history, redis_error = [], {}, type(exc).__name__
    worker_rows: list[dict[str, Any]] = []
    request_rows: list[dict[str, Any]] = []
    for worker in workers:
        worker_rows.append({
            "worker_id": worker.worker_id,
            "model": worker.model,
            "device": worker.device,
            "memory": dataclasses.asdict(worker.memory),
            "num_running": worker.num_running,
            "num_waiting": worker.num_waiting,
            "context_length": worker.context_length,
            "last_seen_s": round(max(0.0, now - worker.sent_at), 3),
            "cache": worker.cache,
            "cache_entries": list(worker.cache_entries),
            "tokens_per_second": recent_rate(history.get(worker.worker_id, [])),
        })
        for request in worker.requests:
            request_rows.append({"worker_id": worker.worker_id, **{f: request.get(f) for f in REQUEST_FIELDS}})
    engine_tps = sum(row["tokens_per_second"] for row in worker_rows)
    return {
        "generated_at": now,
        "redis_error": redis_error,
        "workers": worker_rows,
        "requests": request_rows,
        "jobs": job_status_counts(),
        # What the engines hold now, from the same heartbeats as the workers' rows (the jobs'
        # in_progress count also holds jobs claimed and not yet in an engine, and ones whose
        # worker died before the reconciler moved them).
        "engines": {"running": sum(row["num_running"] for row in worker_rows),
                    "waiting": sum(row["num_waiting"] for row in worker_rows)},
        # tokens_per_second: completion tokens of the jobs that finished in the window (a job's
        # tokens count when it ends); engine_tokens_per_second: what the engines generate now.
        "throughput": {**job_throughput(window_s=60), "engine_tokens_per_second": round(engine_tps, 1)},
        "history_s": WORKER_HISTORY_S,
        "history": {worker_id: [p for p in points if since is None or p["t"] > since]
                    for worker_id, points in history.items()},
    }
