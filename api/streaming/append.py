"""The one way anything writes to a job's stream (``job:<id>:chunks``, messages.py): the engine
worker's sink (chunks and finals), the worker's restart of a job that runs again (a reset entry)
and the end of a job that never reached a worker all append through :func:`stream_append`, so
every stream is bounded and expires the same way; :func:`streams_append` is its form for many jobs
at once (the sink's whole output batch).
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping

import redis
from django.conf import settings

from api.common.redis_keys import job_stream_key

# Bounds a stream's length (approximately); one entry per engine step per job, so a job under the
# 4096-token cap writes at most ~4097 entries.
STREAM_MAXLEN = 10_000


def stream_ttl_s() -> int:
    """How long a job's stream stays replayable after its final, its last write
    (``JOB_STREAM_TTL_S``; the worker's sink refreshes a running job's TTL only every half of it);
    after that a client that resumes gets the job's end from the database."""
    return int(settings.JOB_STREAM_TTL_S)


def stream_append(pipe: redis.client.Pipeline, *, job_id: str, entries: Iterable[dict[str, str]],
                  refresh_ttl: bool = True) -> None:
    """Queue on ``pipe`` the append of ``entries`` (stream entries, messages.py), in order, to
    ``job_id``'s stream, and (``refresh_ttl``) the refresh of the stream's TTL. The caller executes
    the pipeline: one round trip for every job it appends to (the sink writes a whole output batch
    in one), in one transaction with what else it holds if it was made with ``transaction=True``."""
    key = job_stream_key(job_id)
    for entry in entries:
        pipe.xadd(key, entry, maxlen=STREAM_MAXLEN, approximate=True)  # type: ignore[arg-type]  # redis-py wants an invariant dict of its own value union
    if refresh_ttl:
        pipe.expire(key, stream_ttl_s())


def streams_append(pipe: redis.client.Pipeline, *, entries: Mapping[str, Iterable[dict[str, str]]],
                   refresh_ttl: Container[str] | None = None) -> None:
    """:func:`stream_append` of each job's entries (job id -> its entries, in order), all queued on
    ``pipe``: the caller's one ``execute`` writes every job's stream in one round trip. The TTL of
    the streams in ``refresh_ttl`` is refreshed (default: every one's)."""
    for job_id, job_entries in entries.items():
        stream_append(pipe, job_id=job_id, entries=job_entries,
                      refresh_ttl=refresh_ttl is None or job_id in refresh_ttl)
