"""The stream of a claimed job that ran before (service.py's ``admit`` claims, then calls this).

A job whose earlier attempt ended with its worker (it died, or handed the job back) starts its
stream afresh: the old entries go, and a ``reset`` entry whose seq follows
every seq of the earlier attempt tells the clients following it to drop what they have
(api/streaming/relay.py); the new attempt's chunks are numbered on from there.
"""

from __future__ import annotations

import logging

import redis

from api.common.redis_keys import job_stream_key
from api.models import Job
from api.streaming import messages
from api.streaming.append import stream_append

logger = logging.getLogger(__name__)


def stream_restart(*, redis_client: redis.Redis, job: Job) -> int:
    """Start the stream of a job that ran before anew; returns the seq its first chunk takes.

    The reset's seq is past both the stream's last seq and the row's (the row may be ahead when
    the stream was lost). An earlier attempt that streamed nothing (no stream, no seq in the row)
    needs no reset: the job starts at seq 1. With Redis down nothing is written, and the chunks
    still continue the row's seqs."""
    key = job_stream_key(str(job.id))
    try:
        last = redis_client.xrevrange(key, count=1)
        stream_seq = int((last[0][1] or {}).get("seq", 0)) if last else 0
        if not last and job.last_seq == 0:
            return 1  # the earlier attempt streamed nothing: there is nothing to drop
        reset_seq = max(stream_seq, job.last_seq) + 1
        pipe = redis_client.pipeline(transaction=True)
        pipe.delete(key)
        stream_append(pipe, job_id=str(job.id), entries=[messages.reset_entry(reset_seq)])
        pipe.execute()
    except redis.RedisError:
        logger.warning("job %s: could not restart its stream", job.id, exc_info=True)
        reset_seq = job.last_seq + 1
    return reset_seq + 1
