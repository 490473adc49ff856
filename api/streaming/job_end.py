"""The end of a job that never reached a worker, sent to the clients watching it.

A worker publishes every job's final itself (api/streaming/sink.py). A job cancelled while still
queued never reaches one, so without this its watchers learnt of the end only from the relay's
database check, after three seconds of silence (relay.py). Here the final goes to the job's
stream (for a client that connects or resumes later) and then to its live group, as the sink
sends them.
"""

from __future__ import annotations

import logging

import redis

from api.keys import job_group_name, job_stream_key
from api.models import Job
from api.redis_client import get_redis
from api.streaming import messages
from api.streaming.fanout import process_group_sender

logger = logging.getLogger(__name__)


def stream_job_end(*, job: Job) -> None:
    """Publish the final of ``job`` (finished, its row as stored) to its stream and its group.
    Best effort: with Redis down the watchers still end from the row (relay.py)."""
    message = messages.final_from_job(job)
    key = job_stream_key(str(job.id))
    try:
        pipe = get_redis().pipeline(transaction=False)
        pipe.xadd(key, messages.final_entry_from_message(message), maxlen=messages.STREAM_MAXLEN, approximate=True)
        pipe.expire(key, messages.stream_ttl_s())
        pipe.execute()
        process_group_sender().send([(job_group_name(str(job.id)), {"type": messages.EVENT_FINAL, "message": message})])
    except (redis.RedisError, OSError, TimeoutError):
        logger.warning("Could not publish the end of job %s to its watchers", job.id, exc_info=True)
