"""Claims: a worker takes queued jobs to run (queued → in_progress), and the wire form of a claimed job.

A claim is one conditional statement: a job runs at most once at a time, and a duplicate Celery
delivery, a late worker or a second reconciler's message claims nothing.
"""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db import connection
from django.utils import timezone

from api.jobs.services.columns import job_column, job_field
from api.models import SAMPLING_DEFAULTS, Job, JobStatus
from engine_worker.protocol import JobSpec


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


def jobs_claim(*, job_id: str, worker_id: str, lease_s: float, model: str, limit: int) -> list[Job]:
    """:func:`job_claim` of ``job_id`` and, in the same statement, of the other queued jobs of
    ``model`` this worker may take, up to ``limit`` jobs in all (``limit`` <= 1: ``job_id``
    alone). Returns the claimed jobs, ``job_id`` first, the others in queue order (priority, then
    arrival). The others: not cancelled, routed to no worker or to this one, and sent to the broker
    at least once (a batch's job the feeder holds back is not); their own messages then find them
    claimed and do nothing.

    PostgreSQL locks the chosen rows with ``FOR UPDATE SKIP LOCKED``, so two workers claiming at
    once take different jobs instead of waiting on each other; the outer ``WHERE`` repeats the
    conditions, so a row that changed meanwhile is not taken. SQLite, which has one writer at a
    time, runs the same statement without the lock clause (its ``UPDATE`` is one write)."""
    now = timezone.now()
    values = {"status": JobStatus.IN_PROGRESS.value, "worker_id": worker_id,
              "lease_expires_at": now + dt.timedelta(seconds=lease_s), "started_at": now, "first_token_at": None,
              "output_text": "", "completion_tokens": 0}
    pk = Job._meta.pk
    job_pk = pk.get_db_prep_value(pk.to_python(job_id), connection)
    queued = JobStatus.QUEUED.value
    sql, sets = _batch_claim_statement(values)
    params = [queued, False, model, job_pk, limit > 1, worker_id, job_pk, max(1, limit), *sets, queued, False]
    claimed = list(Job.objects.raw(sql, params))
    claimed.sort(key=lambda job: (str(job.id) != str(job_id), job.priority, job.queued_at))
    return claimed


def _batch_claim_statement(values: dict) -> tuple[str, list]:
    q = connection.ops.quote_name
    column = {name: job_column(name) for name in (
        "status", "cancel_requested", "model", "dispatch_count", "routed_worker", "priority", "queued_at", "attempts")}
    table, pk = q(Job._meta.db_table), job_column(Job._meta.pk.name)
    sets = [f"{job_column(name)} = %s" for name in values]
    # The chosen ids in a CTE evaluated once: as ``IN (subquery)`` PostgreSQL may run the subquery
    # again per row it updates, and LIMIT would no longer bound the claim.
    pg = connection.vendor == "postgresql"
    sql = (f"WITH picked AS {'MATERIALIZED ' if pg else ''}(SELECT {pk} FROM {table} WHERE {column['status']} = %s "
           f"AND {column['cancel_requested']} = %s AND {column['model']} = %s "
           f"AND ({pk} = %s OR (%s AND {column['dispatch_count']} > 0 "
           f"AND ({column['routed_worker']} IS NULL OR {column['routed_worker']} = %s))) "
           f"ORDER BY CASE WHEN {pk} = %s THEN 0 ELSE 1 END, {column['priority']}, {column['queued_at']} "
           f"LIMIT %s{' FOR UPDATE SKIP LOCKED' if pg else ''}) "
           f"UPDATE {table} SET {', '.join(sets)}, {column['attempts']} = {column['attempts']} + 1 "
           f"WHERE {pk} IN (SELECT {pk} FROM picked) AND {column['status']} = %s "
           f"AND {column['cancel_requested']} = %s RETURNING *")
    return sql, [job_field(name).get_db_prep_save(value, connection) for name, value in values.items()]


def job_queued_for_other_model(*, job_id: str, model: str) -> bool:
    """Whether ``job_id`` waits in the queue for a model other than ``model`` (its message reached
    a worker of another model: it is sent on to its own)."""
    return Job.objects.filter(id=job_id, status=JobStatus.QUEUED, cancel_requested=False).exclude(model=model).exists()


def _claim_statement(values: dict, *, with_model: bool) -> tuple[str, list]:
    q = connection.ops.quote_name
    sets = [f"{job_column(name)} = %s" for name in values]
    attempts = job_column("attempts")
    sql = (f"UPDATE {q(Job._meta.db_table)} SET {', '.join(sets)}, {attempts} = {attempts} + 1 "
           f"WHERE {job_column(Job._meta.pk.name)} = %s AND {job_column('status')} = %s "
           f"AND {job_column('cancel_requested')} = %s")
    if with_model:
        sql += f" AND {job_column('model')} = %s"
    sql += " RETURNING *"
    return sql, [job_field(name).get_db_prep_save(value, connection) for name, value in values.items()]


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
