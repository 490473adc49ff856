"""The INSERT of a new job, and its queue position, in one prepared round trip.

Every submission inserts one job and answers with its queue position. Through the ORM that was
two round trips (``Job.objects.create`` and the position's ``COUNT``) and about a millisecond of
CPU compiling an INSERT that never changes. Here the statement is built once per database alias
from the model's own field list, the parameters are prepared by each field exactly as the ORM's
insert compiler prepares them (``pre_save`` then ``get_db_prep_save``), and the position comes back
from a ``RETURNING`` subquery of the same statement. The inserted instance ends in the ORM's state
for a saved row. ``pre_save``/``post_save`` signals are not sent: nothing listens to them for
``Job`` (a test keeps it so).

On PostgreSQL, outside a transaction, :func:`job_insert_within_quota` sends the whole submission
as one call: ``BEGIN``, this INSERT, the key's quota gate (services/quotas.py, a server function)
and ``COMMIT``. Every submission of one key waits for that key's row lock. Taken in Django's
transaction, the lock was held across the usage query's answer, the Python that checked it and
the ``COMMIT``'s round trip, all waiting for the GIL in a busy web process: on the 16-core GPU
host, 32 simultaneous submissions of one key queued 23-28 ms (median) for that lock. Here the
database decides, and the lock is held only for the server's own work up to the ``COMMIT``.

:func:`job_insert_rehearsal` runs that call on a connection and rolls it back, so a web
process can pay, before its first client does, what a database backend's first submission costs:
compiling the gate and the NOTIFY trigger, planning their statements, loading the tables'
catalog entries. On the dev VM a new backend's first submission took 6.1-6.5 ms against 1.1-1.3
ms once warm, and most of the difference was server CPU, part of it under the key's lock. The
web processes borrow their connections from a pool in turn, so one job at a time on the GPU host
nearly every submission met a backend that had not run one yet: the call took 4.6-8.1 ms in the
service against 1.6 ms in ``bench/insert_parts.py``.
"""

from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.contrib.auth import get_user_model
from django.db import DatabaseError, connections, transaction
from django.db.models import Field
from django.utils import timezone

from api.models import ApiKey, Job
from api.selectors.jobs import job_queue_position, jobs_ahead_params, jobs_ahead_sql
from api.services.quotas import KeyUsage, quota_gate_params, quota_gate_sql


@dataclass(frozen=True)
class _Statement:
    sql: str
    fields: list[Field]


def job_insert(job: Job, *, using: str = "default") -> int:
    """INSERT ``job`` (a new, unsaved instance) and return how many queued jobs are ahead of it in
    the engine's admission order (priority, then arrival): see ``selectors.jobs.job_queue_position``."""
    connection = connections[using]
    if not connection.features.can_return_columns_from_insert:  # SQLite before 3.35: no RETURNING
        job.save(force_insert=True, using=using)
        return job_queue_position(job=job)
    with connection.cursor() as cursor:
        cursor.execute(_statement(using).sql, _insert_params(job, using))
        position = cursor.fetchone()[0]
    _mark_saved(job, using)
    return int(position)


def can_insert_within_quota(using: str = "default") -> bool:
    """Whether :func:`job_insert_within_quota` can run: PostgreSQL, in autocommit (it sends its
    own ``BEGIN``/``COMMIT``, so never inside ``transaction.atomic``)."""
    connection = connections[using]
    return connection.vendor == "postgresql" and connection.get_autocommit() and not connection.in_atomic_block


def job_insert_within_quota(job: Job, *, now: dt.datetime, using: str = "default") -> tuple[int, KeyUsage]:
    """INSERT ``job`` and pass its key's quota gate in one transaction and one round trip. Returns
    its queue position and the key's usage with the job counted. When ``usage.exceeded()`` the job
    was deleted again before the commit (the caller raises QuotaExceeded); otherwise it is
    committed and queued. Raises ``ApiKey.DoesNotExist`` if the key was deleted meanwhile."""
    connection = connections[using]
    sql = f"BEGIN; {_statement(using).sql}; {quota_gate_sql()}; COMMIT"
    params = _insert_params(job, using) + quota_gate_params(api_key_id=job.api_key_id, job_id=job.id, now=now)
    with connection.cursor() as cursor:
        try:
            cursor.execute(sql, params)
            # A missing key row leaves the gate without a row, and the job's deferred foreign
            # key then fails the COMMIT: handled below.
            position, usage = _row_results(cursor)
        except DatabaseError:
            _rollback(cursor)
            if not ApiKey.objects.using(using).filter(id=job.api_key_id).exists():
                # The deferred foreign key failed at COMMIT: the key was deleted after the request
                # authenticated with it.
                raise ApiKey.DoesNotExist(f"API key {job.api_key_id} no longer exists") from None
            raise
    _mark_saved(job, using)
    return int(position[0]), KeyUsage(*(int(v) for v in usage))


# PostgreSQL plans a PL/pgSQL statement anew for its first five runs on a backend, and only then
# decides whether to keep a generic plan: the gate's usage query gets one on the sixth.
REHEARSALS = 6


def job_insert_rehearsal(*, using: str = "default", times: int = REHEARSALS) -> bool:
    """Run :func:`job_insert_within_quota`'s statements ``times`` times on this connection, each
    in a transaction that is rolled back: the job's INSERT with its queue position, the NOTIFY
    trigger, the gate (on a key row of its own, so no real key's lock is taken) and, with the
    constraints checked at once, the foreign keys. Nothing is kept, and no notice is sent (a
    rolled-back NOTIFY is dropped). False where there is nothing to rehearse (not PostgreSQL)."""
    if not can_insert_within_quota(using):
        return False
    # An existing user as the owner, so the foreign keys can be checked; with none, they are not.
    owner_id = get_user_model().objects.using(using).values_list("pk", flat=True).order_by().first()
    for _ in range(times):
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            if owner_id is not None:
                cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            key = ApiKey(owner_id=owner_id or 0, name="submission rehearsal", prefix="rehearsal",
                         hashed_key=secrets.token_hex(32))
            key.save(using=using, force_insert=True)
            job = Job(owner_id=key.owner_id, api_key=key, prompt="", prompt_token_ids=[0], params={"max_tokens": 1})
            gate = quota_gate_params(api_key_id=key.id, job_id=job.id, now=timezone.now())
            cursor.execute(f"{_statement(using).sql}; {quota_gate_sql()}", _insert_params(job, using) + gate)
            _row_results(cursor)
            transaction.set_rollback(True, using=using)
    return True


def _row_results(cursor: Any) -> list[tuple]:
    """The row of each row-returning statement of a multi-statement call, in order."""
    rows = []
    while True:
        if cursor.description is not None:
            rows.append(cursor.fetchone())
        if not cursor.nextset():
            return rows


def _rollback(cursor: Any) -> None:
    try:
        cursor.execute("ROLLBACK")
    except DatabaseError:  # the connection is gone: Django discards it at the request's end
        pass


def _insert_params(job: Job, using: str) -> list[Any]:
    connection = connections[using]
    params = [field.get_db_prep_save(field.pre_save(job, True), connection) for field in _statement(using).fields]
    return params + jobs_ahead_params(job)


def _mark_saved(job: Job, using: str) -> None:
    job._state.adding = False
    job._state.db = using


@cache
def _statement(using: str) -> _Statement:
    quote = connections[using].ops.quote_name
    table = quote(Job._meta.db_table)
    fields = list(Job._meta.concrete_fields)
    columns = ", ".join(quote(f.column) for f in fields)
    values = ", ".join(["%s"] * len(fields))
    # Jobs ahead: job_queue_position's COUNT. Whether the subquery sees the new row does not
    # matter: the row is never strictly ahead of itself.
    ahead = jobs_ahead_sql(table, alias="ahead")
    return _Statement(sql=f"INSERT INTO {table} ({columns}) VALUES ({values}) RETURNING ({ahead})", fields=fields)
