"""The engine dashboard's data: workers, their running requests and caches, and throughput."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import redis

from api.selectors.jobs import job_status_counts, job_throughput
from api.selectors.workers import worker_list

# The per-request fields of the seed's Scheduler.get_running_requests_info().
REQUEST_FIELDS = (
    "request_id", "status", "phase", "elapsed_s", "prompt_tokens", "completion_tokens", "max_tokens",
    "progress", "tokens_per_second", "ttft_s", "cache_hit_type", "cached_tokens",
)


def engine_overview() -> dict[str, Any]:
    """A JSON-ready snapshot for the dashboard. Redis being down is shown, not raised."""
    now = time.time()
    try:
        workers = worker_list()
        redis_error = None
    except redis.RedisError as exc:
        workers, redis_error = [], type(exc).__name__
    worker_rows, request_rows = [], []
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
        })
        for request in worker.requests:
            request_rows.append({"worker_id": worker.worker_id, **{f: request.get(f) for f in REQUEST_FIELDS}})
    engine_tps = sum(float(r["tokens_per_second"] or 0) for r in request_rows if r["status"] != "waiting")
    return {
        "generated_at": now,
        "redis_error": redis_error,
        "workers": worker_rows,
        "requests": request_rows,
        "jobs": job_status_counts(),
        "throughput": {**job_throughput(window_s=60), "engine_tokens_per_second": round(engine_tps, 3)},
    }
