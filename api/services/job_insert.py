"""The INSERT of a new job, and its queue position, in one prepared round trip.

Every submission inserts one job and answers with its queue position. Through the ORM that was
two round trips (``Job.objects.create`` and the position's ``COUNT``) and about a millisecond of
CPU compiling an INSERT that never changes. Here the statement is built once per database alias
from the model's own field list, the parameters are prepared by each field exactly as the ORM's
insert compiler prepares them (``pre_save`` then ``get_db_prep_save``), and the position comes back
from a ``RETURNING`` subquery of the same statement. The inserted instance ends in the ORM's state
for a saved row. ``pre_save``/``post_save`` signals are not sent: nothing listens to them for
``Job`` (a test keeps it so).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from django.db import connections
from django.db.models import Field

from api.models import Job
from api.selectors.jobs import job_queue_position, jobs_ahead_params, jobs_ahead_sql


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
    statement = _statement(using)
    params = [field.get_db_prep_save(field.pre_save(job, True), connection) for field in statement.fields]
    params += jobs_ahead_params(job)
    with connection.cursor() as cursor:
        cursor.execute(statement.sql, params)
        position = cursor.fetchone()[0]
    job._state.adding = False
    job._state.db = using
    return int(position)


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
