"""What engine workers write of their running jobs: progress, finals, failures.

Every write is conditional on the worker still holding the job (``status=in_progress`` and its
``worker_id``): a worker whose lease expired and whose job was handed on changes nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass
from functools import cache

from django.db import connection, transaction
from django.utils import timezone

from api.jobs.services.columns import job_column
from api.models import Job, JobStatus
from api.webhooks.job_events import job_webhooks_enqueue
from engine_worker.protocol import FinalResult


def _from_unix(ts: float | None) -> dt.datetime | None:
    return None if ts is None else dt.datetime.fromtimestamp(ts, tz=dt.UTC)


@dataclass(frozen=True)
class Progress:
    job_id: str
    text: str
    last_seq: int
    completion_tokens: int
    first_token_at: float | None = None  # unix time; kept where the row already has one


def jobs_record_progress(*, worker_id: str, progress: list[Progress]) -> int:
    """The text so far of running jobs (throttled by the caller), for polling clients, and the
    first-token times seen since the last write, in one transaction (one statement on
    PostgreSQL). A row's first-token time, once set, stays.

    Plain SQL: the ORM's form of it (a CASE per column with a WHEN per job) costs several times the
    CPU, mostly compiling the query, on the thread that writes every job's output."""
    if not progress:
        return 0
    pk, text = Job._meta.pk, Job._meta.get_field("output_text")
    stamp = Job._meta.get_field("first_token_at")
    rows = [(pk.get_db_prep_value(uuid.UUID(p.job_id), connection), text.get_db_prep_value(p.text, connection),
             p.last_seq, p.completion_tokens, stamp.get_db_prep_value(_from_unix(p.first_token_at), connection))
            for p in {p.job_id: p for p in progress}.values()]
    in_progress = JobStatus.IN_PROGRESS.value
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":  # one statement, as for the finals (jobs_complete)
            cursor.execute(_progress_sql_pg().format(rows=", ".join([_PROGRESS_ROW_PG] * len(rows))),
                           [*(value for row in rows for value in row), in_progress, worker_id])
        else:
            cursor.executemany(_progress_sql(), [(*row[1:], row[0], in_progress, worker_id) for row in rows])
        return cursor.rowcount


_PROGRESS_ROW_PG = "(%s::uuid, %s::text, %s::integer, %s::integer, %s::timestamptz)"


def _job_columns(*names: str) -> dict[str, str]:
    """The job table's quoted column of each field name (default connection)."""
    return {name: job_column(name) for name in names}


@cache
def _progress_sql_pg() -> str:
    q = connection.ops.quote_name
    column = _job_columns("id", "output_text", "last_seq", "completion_tokens", "first_token_at", "status", "worker_id")
    names = ("output_text", "last_seq", "completion_tokens")
    first = column["first_token_at"]
    return (
        f"UPDATE {q(Job._meta.db_table)} AS j SET " + ", ".join(f"{column[n]} = v.{column[n]}" for n in names)
        + f", {first} = COALESCE(j.{first}, v.{first})"
        + f" FROM (VALUES {{rows}}) AS v({column['id']}, {', '.join(column[n] for n in names)}, {first}) "
        f"WHERE j.{column['id']} = v.{column['id']} AND j.{column['status']} = %s AND j.{column['worker_id']} = %s"
    )


@cache
def _progress_sql() -> str:
    q = connection.ops.quote_name
    column = _job_columns("output_text", "last_seq", "completion_tokens", "first_token_at", "id", "status", "worker_id")
    return (
        f"UPDATE {q(Job._meta.db_table)} SET {column['output_text']} = %s, {column['last_seq']} = %s, "
        f"{column['completion_tokens']} = %s, {column['first_token_at']} = COALESCE({column['first_token_at']}, %s) "
        f"WHERE {column['id']} = %s AND {column['status']} = %s AND {column['worker_id']} = %s"
    )


def jobs_complete(*, results: list[FinalResult], worker_id: str) -> list[str]:
    """:func:`jobs_store_finals`, for the ids of the jobs whose finals it stored."""
    return jobs_store_finals(results=results, worker_id=worker_id).job_ids


@dataclass(frozen=True)
class StoredFinals:
    job_ids: list[str]  # the jobs whose rows took their finals: only these may be published
    batches: frozenset[tuple[int | None, str]]  # (api key id, batch id) of those that were a batch's


def jobs_store_finals(*, results: list[FinalResult], worker_id: str) -> StoredFinals:
    """in_progress → completed / failed / cancelled with the engine's text and token counts, for
    the finals of one output batch. Returns the jobs whose rows it changed, and the batches they
    belong to (the UPDATE returns them: nobody reads the rows again to learn which batches moved).

    A job whose cancellation already moved it to ``cancelled`` still gets its partial text and
    usage. A worker that no longer holds the job (its lease expired and it was handed on) changes
    nothing.

    One transaction for the batch: a commit per final would hold the last of a step's finals back
    by the others' round trips. On PostgreSQL the batch is one ``UPDATE ... FROM (VALUES ...)``,
    parsed and planned once, where an ``executemany`` would parse and plan a statement per job.
    The webhooks of the jobs it ends are recorded in the same transaction (api/webhooks/job_events.py)."""
    if not results:
        return StoredFinals(job_ids=[], batches=frozenset())
    # A job's last final wins, as it would have with one statement per final.
    last = {r.job_id: r for r in results}
    params = [_final_params(r) for r in last.values()]
    in_progress, cancelled = JobStatus.IN_PROGRESS.value, JobStatus.CANCELLED.value
    with transaction.atomic():
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                rows = ", ".join([_FINAL_ROW_PG] * len(params))
                cursor.execute(_complete_sql_pg().format(rows=rows), [
                    in_progress, *(value for row in params for value in row), worker_id, in_progress, cancelled])
                stored = [(str(job_id), *returned) for job_id, *returned in cursor.fetchall()]
            else:
                stored = []
                for job_id, row in zip(last, params, strict=True):
                    cursor.execute(_complete_sql(), (in_progress, *row[1:11], row[12], row[0], worker_id, in_progress,
                                                     cancelled, row[11]))
                    returned = cursor.fetchone()
                    if returned is not None:
                        stored.append((job_id, *returned))
        # Only the jobs that named a webhook cost anything more (the UPDATE says which they are).
        hooked = [job_id for job_id, has_webhook, _, _ in stored if has_webhook]
        if hooked:
            job_webhooks_enqueue(job_ids=hooked, send=False)
    return StoredFinals(job_ids=[job_id for job_id, *_ in stored],
                        batches=frozenset((key, str(batch)) for _, _, key, batch in stored if batch is not None))


def _final_params(r: FinalResult) -> tuple:
    """(id, status, output_text, finish_reason, error, prompt_tokens, cached_tokens,
    completion_tokens, finished_at, last_seq, first_token_at, abort, logprobs as JSON) of one final."""
    pk, stamp, text = Job._meta.pk, Job._meta.get_field("finished_at"), Job._meta.get_field("output_text")
    return (pk.get_db_prep_value(uuid.UUID(r.job_id), connection),
            JobStatus.for_finish_reason(r.finish_reason).value,
            text.get_db_prep_value(r.text, connection), r.finish_reason, r.error,
            r.prompt_tokens, r.cached_tokens, r.completion_tokens,
            stamp.get_db_prep_value(_from_unix(r.finished_at) or timezone.now(), connection), r.last_seq,
            stamp.get_db_prep_value(_from_unix(r.first_token_at), connection), r.finish_reason == "abort",
            None if r.logprobs is None else json.dumps(r.logprobs))


_FINAL_COLUMNS = ("id", "status", "output_text", "finish_reason", "error", "prompt_tokens", "cached_tokens",
                  "completion_tokens", "finished_at", "last_seq", "first_token_at")
# One row of the PostgreSQL statement's VALUES, typed (a VALUES list takes its column types from
# its rows, and NULLs alone would make them text).
_FINAL_ROW_PG = ("(%s::uuid, %s::varchar, %s::text, %s::varchar, %s::text, %s::integer, %s::integer, %s::integer, "
                 "%s::timestamptz, %s::integer, %s::timestamptz, %s::boolean, %s::jsonb)")


@cache
def _complete_sql_pg() -> str:
    """The finals' UPDATE on PostgreSQL, with a ``{rows}`` placeholder for the VALUES rows; the
    same rules as :func:`_complete_sql`."""
    q = connection.ops.quote_name
    column = _job_columns(*_FINAL_COLUMNS, "lease_expires_at", "worker_id", "deleted_at", "logprobs", "webhook_url",
                          "api_key", "batch")
    status = f"j.{column['status']}"
    fields = ", ".join(f"{column[name]} = v.{column[name]}" for name in _FINAL_COLUMNS[2:-1])
    return (
        f"UPDATE {q(Job._meta.db_table)} AS j SET {column['status']} = CASE WHEN {status} = %s "
        f"THEN v.{column['status']} ELSE {status} END, {fields}, "
        f"{column['first_token_at']} = COALESCE(j.{column['first_token_at']}, v.{column['first_token_at']}), "
        f"{column['lease_expires_at']} = NULL, {column['logprobs']} = v.{column['logprobs']} "
        f"FROM (VALUES {{rows}}) AS v({', '.join(column[name] for name in _FINAL_COLUMNS)}, abort, "
        f"{column['logprobs']}) "
        f"WHERE j.{column['id']} = v.{column['id']} AND j.{column['worker_id']} = %s "
        f"AND ({status} = %s OR ({status} = %s AND v.abort)) AND j.{column['deleted_at']} IS NULL "
        f"RETURNING j.{column['id']}, j.{column['webhook_url']} <> '', j.{column['api_key']}, j.{column['batch']}"
    )


@cache
def _complete_sql() -> str:
    """The final's UPDATE: the status changes only from in_progress; an aborted job that a cancel
    already moved to cancelled gets its text and usage too, unless its owner deleted it meanwhile
    (its content stays gone). The first-token time is the final's unless the row has one: a job
    whose first token and final the worker sent together (one token, or outputs the I/O thread
    folded into one batch) has no other. Returns whether the job named a webhook."""
    q = connection.ops.quote_name
    column = _job_columns("status", "output_text", "finish_reason", "error", "prompt_tokens", "cached_tokens",
                          "completion_tokens", "finished_at", "last_seq", "first_token_at", "lease_expires_at", "id",
                          "worker_id", "deleted_at", "logprobs", "webhook_url", "api_key", "batch")
    status = column["status"]
    fields = ", ".join(f"{column[name]} = %s" for name in ("output_text", "finish_reason", "error", "prompt_tokens",
                                                           "cached_tokens", "completion_tokens", "finished_at",
                                                           "last_seq"))
    return (
        f"UPDATE {q(Job._meta.db_table)} SET {status} = CASE WHEN {status} = %s THEN %s ELSE {status} END, "
        f"{fields}, {column['first_token_at']} = COALESCE({column['first_token_at']}, %s), "
        f"{column['lease_expires_at']} = NULL, {column['logprobs']} = %s "
        f"WHERE {column['id']} = %s AND {column['worker_id']} = %s "
        f"AND ({status} = %s OR ({status} = %s AND %s)) AND {column['deleted_at']} IS NULL "
        f"RETURNING {column['webhook_url']} <> '', {column['api_key']}, {column['batch']}"
    )


def job_fail(*, job_id: str, worker_id: str, error: str) -> bool:
    """in_progress → failed, if ``worker_id`` holds the job; with its webhook, if it named one."""
    with transaction.atomic():
        failed = Job.objects.filter(id=job_id, status=JobStatus.IN_PROGRESS, worker_id=worker_id).update(
            status=JobStatus.FAILED, finish_reason="error", error=error,
            finished_at=timezone.now(), lease_expires_at=None,
        )
        if failed:
            job_webhooks_enqueue(job_ids=[job_id], send=False)
    return bool(failed)


def job_fail_held(*, job_id: str, worker_id: str, error: str) -> Job | None:
    """:func:`job_fail`, returning the failed row as stored; None where ``worker_id`` no longer
    holds the job (nothing changed)."""
    if not job_fail(job_id=job_id, worker_id=worker_id, error=error):
        return None
    return Job.objects.filter(id=job_id).first()
