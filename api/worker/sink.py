"""The engine worker's output sink: the database and each job's Redis stream.

For each :class:`StepBatch` (one or more engine steps, at most one chunk per job), in this order:

1. database: finals (the job's status, text and usage);
2. one Redis pipeline: XADD every chunk and final to its job's stream, refresh the streams' TTL
   (the clients following a job read its stream, api/streaming/relay.py);
3. database: the text so far of running jobs and the first-token times seen since the last write,
   all of them in one UPDATE every ``progress_interval_s`` (for polling clients). A job that
   finishes first gets its first-token time with its final.

Finals reach the database before the stream, so a client that sees ``final`` and then reads the
job finds it finished; bookkeeping that no client waits for comes last. Runs on the worker's I/O
thread, never on the engine thread.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from django.db import DatabaseError, close_old_connections

from api.keys import job_stream_key
from api.services import job_lifecycle
from api.streaming import messages
from engine_worker.protocol import StepBatch

logger = logging.getLogger(__name__)


class RedisJobSink:
    def __init__(self, *, worker_id: str, redis_client: redis.Redis, progress_interval_s: float = 1.0) -> None:
        self.worker_id = worker_id
        self._redis = redis_client
        self._progress_interval_s = progress_interval_s
        self._texts: dict[str, list[str]] = {}
        self._unsaved: set[str] = set()  # jobs with text the database does not have yet
        self._progress_at = time.monotonic()
        self._tokens: dict[str, tuple[int, int]] = {}  # job id -> (last seq, completion tokens)
        self._first_at: dict[str, float] = {}  # first-token times the database does not have yet

    def publish(self, batch: StepBatch) -> None:
        self._database(self._write_finals, batch)
        self._write_streams(batch)
        self._database(self._write_bookkeeping, batch)

    # -- database -----------------------------------------------------------------------------

    def _database(self, write: Any, batch: StepBatch) -> None:
        try:
            write(batch)
        except DatabaseError:
            logger.exception("database write of a batch failed; the jobs' leases decide what happens next")
            close_old_connections()

    def _write_finals(self, batch: StepBatch) -> None:
        for result in batch.finals:
            self._forget(result.job_id)
        written = job_lifecycle.jobs_complete(results=list(batch.finals), worker_id=self.worker_id)
        if written < len(batch.finals):
            logger.warning("%s of %s jobs finished here (%s) are no longer held by %s", len(batch.finals) - written,
                           len(batch.finals), ", ".join(r.job_id for r in batch.finals), self.worker_id)

    def _write_bookkeeping(self, batch: StepBatch) -> None:
        finished = {r.job_id for r in batch.finals}
        for chunk in batch.chunks:
            if chunk.job_id not in finished:
                self._texts.setdefault(chunk.job_id, []).append(chunk.text)
                self._tokens[chunk.job_id] = (chunk.seq, chunk.completion_tokens)
                self._unsaved.add(chunk.job_id)
        for first in batch.first_tokens:
            if first.job_id not in finished:  # else its final carried the time
                self._first_at.setdefault(first.job_id, first.at)
        self._write_progress()

    def _write_progress(self) -> None:
        """Every job's text so far, in one UPDATE per interval. A timer per job (as before) let
        jobs that started at different steps fall due on different steps: with 32 running jobs
        nearly every batch compiled and ran its own CASE UPDATE, a fifth of the worker's time."""
        now = time.monotonic()
        if not self._unsaved or now - self._progress_at < self._progress_interval_s:
            return
        self._progress_at = now
        due = []
        for job_id in self._unsaved:
            seq, tokens = self._tokens[job_id]
            due.append(job_lifecycle.Progress(job_id=job_id, text="".join(self._texts[job_id]), last_seq=seq,
                                              completion_tokens=tokens, first_token_at=self._first_at.pop(job_id, None)))
        self._unsaved.clear()
        job_lifecycle.jobs_record_progress(worker_id=self.worker_id, progress=due)

    def _forget(self, job_id: str) -> None:
        self._texts.pop(job_id, None)
        self._unsaved.discard(job_id)
        self._tokens.pop(job_id, None)
        self._first_at.pop(job_id, None)

    # -- Redis streams ------------------------------------------------------------------------

    def _write_streams(self, batch: StepBatch) -> None:
        if not (batch.chunks or batch.finals):
            return
        ttl = messages.stream_ttl_s()
        pipe = self._redis.pipeline(transaction=False)
        keys = set()
        for chunk in batch.chunks:
            key = job_stream_key(chunk.job_id)
            pipe.xadd(key, messages.chunk_entry(chunk), maxlen=messages.STREAM_MAXLEN, approximate=True)
            keys.add(key)
        for result in batch.finals:
            key = job_stream_key(result.job_id)
            pipe.xadd(key, messages.final_entry(result), maxlen=messages.STREAM_MAXLEN, approximate=True)
            keys.add(key)
        for key in keys:
            pipe.expire(key, ttl)
        try:
            pipe.execute()
        except redis.RedisError:
            logger.exception("stream write failed for %s jobs; polling and the final in the DB still work", len(keys))
