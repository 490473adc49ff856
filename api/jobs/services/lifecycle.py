"""Job state transitions made by engine workers and the reconciler.

Every transition is one conditional UPDATE (``filter(id=..., status=...).update(...)``): a job
runs at most once at a time, and a duplicate Celery delivery, a late worker or a second
reconciler does nothing. Each function returns whether it changed the row.

Leases: an ``in_progress`` job's ``lease_expires_at`` is renewed by its worker's heartbeat; when it
passes, the reconciler hands the job back to the queue. A ``queued`` job's ``lease_expires_at`` is
the time by which a worker should have claimed it (set when it is dispatched); when it passes, the
reconciler dispatches the job again (its broker message was lost, e.g. Redis was flushed).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import uuid
from dataclasses import dataclass
from functools import cache, partial

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from api.models import SAMPLING_DEFAULTS, Job, JobStatus
from api.streaming.job_end import stream_job_end
from api.webhooks.job_events import job_webhooks_enqueue
from engine_worker.protocol import FinalResult, JobSpec

logger = logging.getLogger(__name__)

def _from_unix(ts: float | None) -> dt.datetime | None:
    return None if ts is None else dt.datetime.fromtimestamp(ts, tz=dt.UTC)


def job_claim(*, job_id: str, worker_id: str, lease_s: float, model: str | None = None) -> Job | None:
    """queued → in_progress for ``worker_id``, unless cancellation was requested, counting the
    attempt. With ``model``, only a job of that model (a worker runs its own model's jobs only). Clears the text and counts of any earlier attempt (its ``last_seq`` stays: the new
    attempt's stream goes on after it). Returns the claimed job, or None if someone else has it,
    it was cancelled, or it is finished.

    One ``UPDATE ... RETURNING`` statement (PostgreSQL, SQLite >= 3.35): the claim is the rule that
    a job runs at most once at a time, and as one statement it holds the row's (or SQLite's
    database's) write lock only for itself."""
    now = timezone.now()
    values = {"status": JobStatus.IN_PROGRESS.value, "worker_id": worker_id,
              "lease_expires_at": now + dt.timedelta(seconds=lease_s), "started_at": now, "first_token_at": None,
              "output_text": "", "completion_tokens": 0}
    sql, params = _claim_statement(values, with_model=model is not None)
    pk = Job._meta.pk
    params += [pk.get_db_prep_value(pk.to_python(job_id), connection), JobStatus.QUEUED.value, False]
    if model is not None:
        params.append(model)
    claimed = list(Job.objects.raw(sql, params))
    return claimed[0] if claimed else None


def job_queued_for_other_model(*, job_id: str, model: str) -> bool:
    """Whether ``job_id`` waits in the queue for a model other than ``model`` (its message reached
    a worker of another model: it is sent on to its own)."""
    return Job.objects.filter(id=job_id, status=JobStatus.QUEUED, cancel_requested=False).exclude(model=model).exists()


def _claim_statement(values: dict, *, with_model: bool) -> tuple[str, list]:
    q = connection.ops.quote_name
    field = Job._meta.get_field
    sets = [f"{q(field(name).column)} = %s" for name in values]
    attempts = q(field("attempts").column)
    sql = (f"UPDATE {q(Job._meta.db_table)} SET {', '.join(sets)}, {attempts} = {attempts} + 1 "
           f"WHERE {q(Job._meta.pk.column)} = %s AND {q(field('status').column)} = %s "
           f"AND {q(field('cancel_requested').column)} = %s")
    if with_model:
        sql += f" AND {q(field('model').column)} = %s"
    sql += " RETURNING *"
    return sql, [field(name).get_db_prep_save(value, connection) for name, value in values.items()]


def job_spec(job: Job, *, first_seq: int = 1) -> JobSpec:
    """The wire form of a claimed job, for the engine; ``first_seq`` numbers its first chunk. A
    setting the row lacks (a job written by hand, say) takes the service's default, as a
    submission would have stored it."""
    params = {**SAMPLING_DEFAULTS, "max_tokens": settings.DEFAULT_MAX_TOKENS,
              **{name: value for name, value in (job.params or {}).items() if value is not None}}
    stop = params["stop"]
    return JobSpec(
        job_id=str(job.id),
        prompt_token_ids=tuple(int(t) for t in job.prompt_token_ids),
        max_tokens=int(params["max_tokens"]),
        temperature=float(params["temperature"]),
        top_p=float(params["top_p"]),
        top_k=int(params["top_k"]),
        min_p=float(params["min_p"]),
        repetition_penalty=float(params["repetition_penalty"]),
        seed=None if params["seed"] is None else int(params["seed"]),
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        priority=int(job.priority),
        ignore_eos=bool(params.get("ignore_eos", False)),
        presence_penalty=float(params["presence_penalty"]),
        frequency_penalty=float(params["frequency_penalty"]),
        logit_bias=tuple((int(token), float(bias)) for token, bias in params["logit_bias"].items()),
        logprobs=None if params["logprobs"] is None else int(params["logprobs"]),
        constraint_kind=(job.constraint or {}).get("kind", ""),
        constraint=(job.constraint or {}).get("text", ""),
        first_seq=first_seq,
    )


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
    q = connection.ops.quote_name
    return {name: q(Job._meta.get_field(name).column) for name in names}


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
    """in_progress → completed / failed / cancelled with the engine's text and token counts, for
    the finals of one output batch. Returns the ids of the jobs whose rows it changed (their finals
    are stored; only those may be published).

    A job whose cancellation already moved it to ``cancelled`` still gets its partial text and
    usage. A worker that no longer holds the job (its lease expired and it was handed on) changes
    nothing.

    One transaction for the batch: a commit per final would hold the last of a step's finals back
    by the others' round trips. On PostgreSQL the batch is one ``UPDATE ... FROM (VALUES ...)``,
    parsed and planned once, where an ``executemany`` would parse and plan a statement per job.
    The webhooks of the jobs it ends are recorded in the same transaction (api/webhooks/job_events.py)."""
    if not results:
        return []
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
                stored = [(str(job_id), hooked) for job_id, hooked in cursor.fetchall()]
            else:
                stored = []
                for job_id, row in zip(last, params, strict=True):
                    cursor.execute(_complete_sql(), (in_progress, *row[1:11], row[12], row[0], worker_id, in_progress,
                                                     cancelled, row[11]))
                    returned = cursor.fetchone()
                    if returned is not None:
                        stored.append((job_id, bool(returned[0])))
        # Only the jobs that named a webhook cost anything more (the UPDATE says which they are).
        hooked = [job_id for job_id, has_webhook in stored if has_webhook]
        if hooked:
            job_webhooks_enqueue(job_ids=hooked, send=False)
    return [job_id for job_id, _ in stored]


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
    column = _job_columns(*_FINAL_COLUMNS, "lease_expires_at", "worker_id", "deleted_at", "logprobs", "webhook_url")
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
        f"RETURNING j.{column['id']}, j.{column['webhook_url']} <> ''"
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
                          "worker_id", "deleted_at", "logprobs", "webhook_url")
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
        f"RETURNING {column['webhook_url']} <> ''"
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


def job_hand_back(*, job_id: str, worker_id: str | None, redispatch_after_s: float) -> JobStatus | None:
    """A running job leaves its worker (handed back on shutdown, or its lease expired). With
    ``worker_id``, only if that worker still holds it; without, only if its lease has expired.

    It goes back to the queue (in_progress → queued), unless its cancellation was requested: then
    it ends ``cancelled`` (with the text and usage its progress recorded) and its watchers are sent
    that end. The worker that was to stop it is gone, and the claim and the reconciler never take
    a queued job whose cancellation was requested, so it would otherwise wait, counted against its
    key's concurrent jobs, until it expired. Returns the job's new status, or None where nothing
    changed."""
    now = timezone.now()
    rows = Job.objects.filter(id=job_id, status=JobStatus.IN_PROGRESS)
    rows = rows.filter(worker_id=worker_id) if worker_id else rows.filter(lease_expires_at__lt=now)
    # Two conditional UPDATEs: a cancel that lands between them finds the job still in progress
    # and is seen by the second; one that lands after the first finds it queued and ends it there.
    # Its text so far and the first-token time go together: both stay (a cancel in the queue ends
    # it with them) until the next claim clears both.
    if rows.filter(cancel_requested=False).update(
        status=JobStatus.QUEUED, worker_id=None, routed_worker=None,
        lease_expires_at=now + dt.timedelta(seconds=redispatch_after_s),
    ):
        return JobStatus.QUEUED
    with transaction.atomic():
        if rows.filter(cancel_requested=True).update(
            status=JobStatus.CANCELLED, finish_reason="abort", finished_at=now, lease_expires_at=None,
        ):
            job_webhooks_enqueue(job_ids=[job_id], send=False)
            transaction.on_commit(partial(_stream_end, job_id))
            return JobStatus.CANCELLED
    return None


def _stream_end(job_id: str) -> None:
    job = Job.objects.filter(id=job_id).first()
    if job is not None:
        stream_job_end(job=job)


def job_mark_dispatched(*, job_id: str, redispatch_after_s: float) -> bool:
    """A queued job was (re)sent to its model's shared queue: count it and set the claim
    deadline; no worker's routed load counts it any more."""
    return bool(
        Job.objects.filter(id=job_id, status=JobStatus.QUEUED).update(
            dispatch_count=F("dispatch_count") + 1, routed_worker=None,
            lease_expires_at=timezone.now() + dt.timedelta(seconds=redispatch_after_s),
        )
    )


def job_renew_leases(*, worker_id: str, job_ids: list[str], lease_s: float) -> int:
    """Extend the leases of the jobs this worker still holds (one UPDATE for all)."""
    if not job_ids:
        return 0
    return Job.objects.filter(id__in=job_ids, worker_id=worker_id, status=JobStatus.IN_PROGRESS).update(
        lease_expires_at=timezone.now() + dt.timedelta(seconds=lease_s)
    )


def jobs_cancel_requested(*, worker_id: str, job_ids: list[str]) -> list[str]:
    """Held jobs the worker should stop: their cancellation was requested (the fallback when the
    pub/sub message is lost), or they already ended cancelled or failed (a job whose output
    could not be stored, api/worker/sink.py)."""
    if not job_ids:
        return []
    rows = Job.objects.filter(id__in=job_ids, worker_id=worker_id).filter(
        Q(cancel_requested=True) | Q(status__in=(JobStatus.CANCELLED, JobStatus.FAILED))
    )
    return [str(pk) for pk in rows.values_list("id", flat=True)]


def jobs_needing_dispatch(*, queued_grace_s: float, limit: int = 500) -> list[str]:
    """Queued jobs whose claim deadline passed (or, never dispatched by us, queued longer than
    ``queued_grace_s``)."""
    now = timezone.now()
    stale = Q(lease_expires_at__lt=now) | Q(
        lease_expires_at__isnull=True, queued_at__lt=now - dt.timedelta(seconds=queued_grace_s)
    )
    # A batch job the feeder has not sent yet waits for it (api/batches/feed.py).
    rows = (Job.objects.filter(status=JobStatus.QUEUED, cancel_requested=False).filter(stale)
            .exclude(batch__isnull=False, dispatch_count=0))
    return [str(pk) for pk in rows.order_by("priority", "queued_at").values_list("id", flat=True)[:limit]]


def jobs_with_expired_lease(*, limit: int = 500) -> list[str]:
    rows = Job.objects.filter(status=JobStatus.IN_PROGRESS, lease_expires_at__lt=timezone.now())
    return [str(pk) for pk in rows.values_list("id", flat=True)[:limit]]


def jobs_expire_queued(*, older_than_s: float, batch: int = 1000) -> int:
    """queued → expired for jobs waiting longer than ``older_than_s``, with the webhooks of those
    that named one; ``batch`` jobs a transaction. A batch's jobs wait for their batch's completion
    window instead (api/batches/services.py)."""
    cutoff = timezone.now() - dt.timedelta(seconds=older_than_s)
    total = 0
    while True:
        with transaction.atomic():
            # Locked first, so the ids are exactly those expired here: a worker's claim of one
            # waits, then finds it no longer queued.
            stale = Job.objects.select_for_update(skip_locked=True).filter(status=JobStatus.QUEUED,
                                                                           queued_at__lt=cutoff,
                                                                           batch__isnull=True)
            ids = list(stale.values_list("id", flat=True)[:batch])
            total += Job.objects.filter(id__in=ids, status=JobStatus.QUEUED).update(
                # It never ran this attempt: its prompt is not charged (a finished job's usage is the engine's).
                status=JobStatus.EXPIRED, finish_reason=None, finished_at=timezone.now(), lease_expires_at=None,
                prompt_tokens=0, cached_tokens=0,
            )
            job_webhooks_enqueue(job_ids=ids, send=False)
        if len(ids) < batch:
            return total
