"""Redis key and channel names shared by the web side and the engine worker.

One place, so both sides agree on spelling. Only plain strings and tiny functions here.
"""

from __future__ import annotations

# Worker heartbeats: JSON of ``protocol.WorkerHeartbeat`` under ``engine:workers:<worker_id>``,
# written every few seconds with this TTL, so a dead worker disappears by itself.
WORKER_HEARTBEAT_PREFIX = "engine:workers:"
WORKER_HEARTBEAT_TTL_S = 15

# Pub/sub channels are one namespace per Redis server, whichever database a client selected: each
# channel's name carries the database number (``channel_db``), so services (or test runs) sharing a
# server on different databases never hear each other.
#
# The channel on which the web side asks workers to stop a running job:
# message = JSON ``{"job_id": "<uuid>"}``. Workers that do not hold the job ignore it.
CANCEL_CHANNEL_PREFIX = "engine:cancel:"

# The channel of one worker on which the admin asks it to drop a prefix-cache entry:
# message = JSON ``{"key": "<key_hash>"}``. Per worker: an entry's key means nothing to another.
EVICT_CHANNEL_PREFIX = "engine:evict:"

# Each worker's recent heartbeats, one JSON sample per beat (``api.worker.history``), in a list
# trimmed to the last WORKER_HISTORY_S seconds' worth and expiring that long after the last beat:
# the dashboard's charts have their history the moment the page opens.
WORKER_HISTORY_PREFIX = "engine:history:"
WORKER_HISTORY_S = 600

# Per-job Redis stream for replay; each entry has the fields below (strings, as Redis stores them).
JOB_STREAM_FIELD_SEQ = "seq"
JOB_STREAM_FIELD_TEXT = "text"

# Channel-layer group of the connections an API key authenticated, named after the key's stored
# hash (known before the key's row is read; not the secret): they hear its revocation.
API_KEY_GROUP_PREFIX = "apikey."

# Per-key request-rate counter (fixed one-minute window).
RATE_LIMIT_PREFIX = "quota:rpm:"


def worker_heartbeat_key(worker_id: str) -> str:
    return f"{WORKER_HEARTBEAT_PREFIX}{worker_id}"


def cancel_channel(db: int) -> str:
    return f"{CANCEL_CHANNEL_PREFIX}{db}"


def worker_evict_channel(db: int, worker_id: str) -> str:
    return f"{EVICT_CHANNEL_PREFIX}{db}:{worker_id}"


def worker_history_key(worker_id: str) -> str:
    return f"{WORKER_HISTORY_PREFIX}{worker_id}"


def job_stream_key(job_id: str) -> str:
    return f"job:{job_id}:chunks"


def api_key_group_name(hashed_key: str) -> str:
    return f"{API_KEY_GROUP_PREFIX}{hashed_key[:32]}"


def rate_limit_key(api_key_id: int, window: int) -> str:
    return f"{RATE_LIMIT_PREFIX}{api_key_id}:{window}"
