"""Reads of API keys: the key behind a secret's hash, with its owner, in one prepared statement.

Every request and every WebSocket connect authenticates, and the ORM's
``ApiKey.objects.select_related("owner").filter(hashed_key=...)`` recompiled the same JOIN each
time: about 1.5 ms of CPU per call on the 2-core machine, most of it building SQL that never
changes. The statement here is built once per database alias from the models' own field lists,
and its rows become the ORM's instances through api/db_rows.py.

A job's WebSocket also asks whether the job is the key owner's: :func:`api_key_with_owner_and_job`
answers both in the same statement. As a second ORM query (``Job.objects.filter(...).exists()``)
that was a second round trip and 0.3-0.5 ms more of CPU per connect on the dev VM, taken in the
web process while the burst's other submissions wait for its GIL.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import connections

from api.db_rows import RowShape, build, row_shape
from api.models import ApiKey, Job


@dataclass(frozen=True)
class _Statement:
    sql: str
    key: RowShape
    owner: RowShape


def api_key_with_owner(*, hashed_key: str, using: str = "default") -> ApiKey | None:
    """The key whose secret hashes to ``hashed_key``, with ``owner`` loaded, or None."""
    statement = _statement(using, with_job=False)
    row = _fetch(statement, [hashed_key], using)
    return None if row is None else _key(statement, row, using)


def api_key_with_owner_and_job(*, hashed_key: str, job_id: str, using: str = "default") -> tuple[ApiKey | None, bool]:
    """:func:`api_key_with_owner`, and whether job ``job_id`` belongs to the key's owner (False
    for a key that is not found, an id that is not a job's, or a job its owner deleted)."""
    try:
        job_pk = Job._meta.pk.get_db_prep_value(Job._meta.pk.to_python(job_id), connections[using])
    except ValidationError:  # not a UUID: no job has it
        return api_key_with_owner(hashed_key=hashed_key, using=using), False
    statement = _statement(using, with_job=True)
    row = _fetch(statement, [job_pk, hashed_key], using)
    if row is None:
        return None, False
    return _key(statement, row, using), bool(row[-1])


def _fetch(statement: _Statement, params: list, using: str) -> tuple | None:
    with connections[using].cursor() as cursor:
        cursor.execute(statement.sql, params)
        return cursor.fetchone()


def _key(statement: _Statement, row: tuple, using: str) -> ApiKey:
    width = statement.key.width
    api_key = build(statement.key, row[:width], using)
    api_key.owner = build(statement.owner, row[width: width + statement.owner.width], using)
    return api_key


@cache
def _statement(using: str, *, with_job: bool) -> _Statement:
    connection = connections[using]
    quote = connection.ops.quote_name
    user_model = get_user_model()
    key_shape, owner_shape = row_shape(ApiKey), row_shape(user_model)
    key_table, user_table = quote(ApiKey._meta.db_table), quote(user_model._meta.db_table)
    columns = f"{key_shape.column_list(quote, key_table)}, {owner_shape.column_list(quote, user_table)}"
    owner_column = quote(ApiKey._meta.get_field("owner").column)
    if with_job:  # the job's id is the first parameter
        job_table = quote(Job._meta.db_table)
        columns += (f", EXISTS (SELECT 1 FROM {job_table} WHERE {job_table}.{quote(Job._meta.pk.column)} = %s "
                    f"AND {job_table}.{quote(Job._meta.get_field('owner').column)} = {key_table}.{owner_column} "
                    f"AND {job_table}.{quote(Job._meta.get_field('deleted_at').column)} IS NULL)")
    sql = (
        f"SELECT {columns} FROM {key_table} "
        f"INNER JOIN {user_table} ON {user_table}.{quote(user_model._meta.pk.column)} = {key_table}.{owner_column} "
        f"WHERE {key_table}.{quote(ApiKey._meta.get_field('hashed_key').column)} = %s"
    )
    return _Statement(sql=sql, key=key_shape, owner=owner_shape)
