"""The end of a job that never reached a worker, sent to the clients watching it.

A worker writes every job's final to its stream itself. A job cancelled while still queued never
reaches one, so here its final goes to the job's stream, where the clients following it (and any
that come later) read it at once. Without it they would learn of the end only from the relay's
check of the row after a few seconds of silence (relay.py).
"""

from __future__ import annotations

import logging

import redis

from api.common.redis_client import get_redis
from api.models import Job
from api.streaming import messages
from api.streaming.append import stream_append

logger = logging.getLogger(__name__)


def stream_job_end(*, job: Job) -> None:
    """Append the final of ``job`` (finished, its row as stored) to its stream. Best effort: with
    Redis down the watchers still end from the row (relay.py)."""
    message = messages.final_from_job(job)
    try:
        pipe = get_redis().pipeline(transaction=False)
        stream_append(pipe, job_id=str(job.id), entries=[messages.final_entry_from_message(message)])
        pipe.execute()
    except (redis.RedisError, OSError, TimeoutError):
        logger.warning("Could not publish the end of job %s to its watchers", job.id, exc_info=True)
