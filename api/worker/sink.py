"""The engine worker's output sink: the database and each job's Redis stream.

For each :class:`StepBatch` (one or more engine steps, at most one chunk per job), in this order:

1. database: finals (the job's status, text and usage);
2. one Redis pipeline: XADD every chunk and stored final to its job's stream, refresh the
   TTL of new, ending and half-expired streams (the clients following a job read its stream,
   api/streaming/relay.py);
3. database: the text so far of running jobs and the first-token times seen since the last write,
   all of them in one UPDATE every ``progress_interval_s`` (for polling clients). A job that
   finishes first gets its first-token time with its final;
4. for the batches whose jobs ended, one message each that has the light worker send the batch's
   next jobs (the finals' UPDATE returns the batches: no read of the rows).

A final is published only once its row is stored, so a client that sees ``final`` and then reads
the job finds it finished, and a final the database did not take (the job was handed on, or the
write failed) is never announced. The webhook of a job that named one is recorded in the
transaction of its final (job_outputs.jobs_store_finals), and sent by the light worker: nothing here
waits on the broker or on a receiver. Bookkeeping that no client waits for comes last.

One job's bad write never costs the others theirs: when a batch's write fails, each job is written
alone. A job whose own write fails for a reason of its own (not a lost connection) ends
``failed`` with :data:`OUTPUT_NOT_STORED`, that end is published, and its later outputs are
dropped (the worker's next heartbeat stops it in the engine). Where the database itself is out of
reach, the jobs' leases decide what happens next. Runs on the worker's I/O thread, never on the
engine thread.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import redis
from django.db import DatabaseError, InterfaceError, OperationalError, close_old_connections

from api.batches.feed import batch_progress_send
from api.jobs.services import outputs as job_outputs
from api.streaming import messages
from api.streaming.append import stream_ttl_s, streams_append
from engine_worker.protocol import FinalResult, OutputChunk, StepBatch

logger = logging.getLogger(__name__)


OUTPUT_NOT_STORED = "The generated output could not be stored ({error})."

# Errors of the connection or the server, not of one job's data: no job fails for them.
_CONNECTION_ERRORS = (OperationalError, InterfaceError)


class RedisJobSink:
    def __init__(self, *, worker_id: str, redis_client: redis.Redis, progress_interval_s: float = 1.0,
                 model: str | None = None) -> None:
        self.worker_id = worker_id
        self._model = model  # named in chunk entries with log probabilities (their tokenizer)
        self._redis = redis_client
        self._progress_interval_s = progress_interval_s
        self._texts: dict[str, list[str]] = {}
        self._unsaved: set[str] = set()  # jobs with text the database does not have yet
        self._progress_at = time.monotonic()
        self._tokens: dict[str, tuple[int, int]] = {}  # job id -> (last seq, completion tokens)
        self._first_at: dict[str, float] = {}  # first-token times the database does not have yet
        self._failed: set[str] = set()  # jobs failed here, until the engine's final of theirs comes
        self._ended_batches: set[tuple[int | None, str]] = set()  # (key, batch) of jobs ended in this batch
        self._ttl_at: dict[str, float] = {}  # job id -> when its stream's TTL was last refreshed
        self._ttl_half_s = stream_ttl_s() / 2

    def publish(self, batch: StepBatch) -> None:
        finals = self._store_finals(batch)
        chunks = [c for c in batch.chunks if c.job_id not in self._failed]
        self._failed.difference_update(r.job_id for r in batch.finals)  # nothing of theirs comes after
        self._write_streams(chunks, finals)
        failed = self._write_bookkeeping(batch)
        if failed:
            self._write_streams([], failed)
        self._batches_moved()

    # -- database -----------------------------------------------------------------------------

    def _store_finals(self, batch: StepBatch) -> list[dict[str, Any]]:
        """Write the batch's finals; returns the final messages of the rows now stored."""
        results = [r for r in batch.finals if r.job_id not in self._failed]  # the others' rows ended failed here
        stored = self._write_finals(results) if results else []
        for result in batch.finals:
            self._forget(result.job_id)
        return stored

    def _write_finals(self, results: list[FinalResult]) -> list[dict[str, Any]]:
        try:
            stored = job_outputs.jobs_store_finals(results=results, worker_id=self.worker_id)
        except DatabaseError:
            logger.warning("writing %s finals together failed; writing each alone", len(results), exc_info=True)
            close_old_connections()
            return self._store_finals_alone(results)
        written = set(stored.job_ids)
        self._ended_batches |= stored.batches
        if len(written) < len(results):
            logger.warning("%s of %s jobs finished here (%s) are no longer held by %s; their finals are dropped",
                           len(results) - len(written), len(results),
                           ", ".join(r.job_id for r in results if r.job_id not in written), self.worker_id)
        return [messages.final_from_result(r) for r in results if r.job_id in written]

    def _store_finals_alone(self, results: list[FinalResult]) -> list[dict[str, Any]]:
        stored: list[dict[str, Any]] = []
        for i, result in enumerate(results):
            try:
                alone = job_outputs.jobs_store_finals(results=[result], worker_id=self.worker_id)
                if alone.job_ids:
                    stored.append(messages.final_from_result(result))
                    self._ended_batches |= alone.batches
            except _CONNECTION_ERRORS:
                logger.warning("database out of reach: %s finals not stored; their leases decide",
                               len(results) - i, exc_info=True)
                close_old_connections()
                break
            except DatabaseError as exc:
                stored += self._fail(result.job_id, exc)
        return stored

    def _fail(self, job_id: str, exc: DatabaseError) -> list[dict[str, Any]]:
        """End ``job_id`` failed: the database refused its output. Returns its final message
        (none if the job is no longer held here, or the database is out of reach)."""
        logger.error("job %s: the database refused its output (%s: %s); it fails", job_id, type(exc).__name__, exc)
        published_seq = self._tokens.get(job_id, (0, 0))[0]  # its chunks so far; none go out after this
        self._forget(job_id)
        try:
            job = job_outputs.job_fail_held(job_id=job_id, worker_id=self.worker_id,
                                              error=OUTPUT_NOT_STORED.format(error=type(exc).__name__))
        except DatabaseError:
            logger.warning("could not record the failure of job %s; its lease decides", job_id, exc_info=True)
            close_old_connections()
            return []
        if job is None:
            return []
        self._failed.add(job_id)
        if job.batch_id is not None:
            self._ended_batches.add((job.api_key_id, str(job.batch_id)))
        # Its end follows the last chunk its clients have: the row's own last_seq may lag behind.
        return [{**messages.final_from_job(job), "seq": published_seq}]

    def _write_bookkeeping(self, batch: StepBatch) -> list[dict[str, Any]]:
        """Record the batch's progress; returns the final messages of jobs failed meanwhile."""
        finished = {r.job_id for r in batch.finals} | self._failed
        for chunk in batch.chunks:
            if chunk.job_id not in finished:
                self._texts.setdefault(chunk.job_id, []).append(chunk.text)
                self._tokens[chunk.job_id] = (chunk.seq, chunk.completion_tokens)
                self._unsaved.add(chunk.job_id)
        for first in batch.first_tokens:
            if first.job_id not in finished:  # else its final carried the time
                self._first_at.setdefault(first.job_id, first.at)
        return self._write_progress()

    def _write_progress(self) -> list[dict[str, Any]]:
        """Every job's text so far, in one UPDATE per interval for all of them: with a timer per
        job, jobs that started at different steps would fall due on different steps, and nearly
        every batch would compile and run an UPDATE of its own."""
        now = time.monotonic()
        if not self._unsaved or now - self._progress_at < self._progress_interval_s:
            return []
        self._progress_at = now
        due = []
        for job_id in self._unsaved:
            seq, tokens = self._tokens[job_id]
            due.append(job_outputs.Progress(job_id=job_id, text="".join(self._texts[job_id]), last_seq=seq,
                                              completion_tokens=tokens, first_token_at=self._first_at.pop(job_id, None)))
        self._unsaved.clear()
        try:
            job_outputs.jobs_record_progress(worker_id=self.worker_id, progress=due)
            return []
        except DatabaseError:
            logger.warning("writing the progress of %s jobs together failed; writing each alone", len(due),
                           exc_info=True)
            close_old_connections()
        failed: list[dict[str, Any]] = []
        for i, progress in enumerate(due):
            try:
                job_outputs.jobs_record_progress(worker_id=self.worker_id, progress=[progress])
            except _CONNECTION_ERRORS:
                logger.warning("database out of reach: the progress of %s jobs not stored", len(due) - i,
                               exc_info=True)
                close_old_connections()
                break
            except DatabaseError as exc:
                failed += self._fail(progress.job_id, exc)
        return failed

    def _batches_moved(self) -> None:
        """Ask the light worker to send the next jobs of the batches whose jobs ended in this output
        batch, once per batch (api/batches/feed.py); the UPDATEs that ended them said which.
        Beat's tick does it too, so a failed send only delays."""
        for api_key_id, batch_id in self._ended_batches:
            batch_progress_send(api_key_id=api_key_id, batch_id=batch_id)
        self._ended_batches.clear()

    def _forget(self, job_id: str) -> None:
        self._ttl_at.pop(job_id, None)
        self._texts.pop(job_id, None)
        self._unsaved.discard(job_id)
        self._tokens.pop(job_id, None)
        self._first_at.pop(job_id, None)

    # -- Redis streams ------------------------------------------------------------------------

    def _write_streams(self, chunks: list[OutputChunk], finals: list[dict[str, Any]]) -> None:
        if not (chunks or finals):
            return
        entries: dict[str, list[dict[str, str]]] = {}
        for chunk in chunks:
            entries.setdefault(chunk.job_id, []).append(messages.chunk_entry(chunk, model=self._model))
        for final in finals:
            entries.setdefault(final["job_id"], []).append(messages.final_entry_from_message(final))
        # A job's stream TTL counts from its last refresh: refreshed at its first write here, at
        # its final, and once half of it has passed (``stream_ttl_s``, hours), not at every step.
        now = time.monotonic()
        ended = {final["job_id"] for final in finals}
        refresh = {job_id for job_id in entries if job_id in ended or now - self._ttl_at.get(job_id, -math.inf) >= self._ttl_half_s}
        self._ttl_at.update((job_id, now) for job_id in refresh - ended)
        pipe = self._redis.pipeline(transaction=False)
        streams_append(pipe, entries=entries, refresh_ttl=refresh)
        try:
            pipe.execute()
        except redis.RedisError:
            logger.exception("stream write failed for %s jobs; polling and the final in the DB still work", len(entries))
