"""Redis key and channel names shared by the web side and the engine worker.

One place, so both sides agree on spelling. Only plain strings and tiny functions here.
"""

from __future__ import annotations

# Worker heartbeats: JSON of ``protocol.WorkerHeartbeat`` under ``engine:workers:<worker_id>``,
# written every few seconds with this TTL, so a dead worker disappears by itself.
WORKER_HEARTBEAT_PREFIX = "engine:workers:"
WORKER_HEARTBEAT_TTL_S = 15

# Pub/sub channel on which the web side asks workers to stop a running job:
# message = JSON ``{"job_id": "<uuid>"}``. Workers that do not hold the job ignore it.
CANCEL_CHANNEL = "engine:cancel"

# Per-job Redis stream for replay; each entry has the fields below (strings, as Redis stores them).
JOB_STREAM_FIELD_SEQ = "seq"
JOB_STREAM_FIELD_TEXT = "text"

# Per-key request-rate counter (fixed one-minute window).
RATE_LIMIT_PREFIX = "quota:rpm:"


def worker_heartbeat_key(worker_id: str) -> str:
    return f"{WORKER_HEARTBEAT_PREFIX}{worker_id}"


def job_stream_key(job_id: str) -> str:
    return f"job:{job_id}:chunks"


def rate_limit_key(api_key_id: int, window: int) -> str:
    return f"{RATE_LIMIT_PREFIX}{api_key_id}:{window}"
