"""Reads of API keys: the key behind a secret's hash, with its owner, in one prepared statement.

Every request and every WebSocket connect authenticates, and the ORM's
``ApiKey.objects.select_related("owner").filter(hashed_key=...)`` recompiled the same JOIN each
time: about 1.5 ms of CPU per call on the 2-core machine, most of it building SQL that never
changes. The statement here is built once per database alias from the models' own field lists,
and its rows become the ORM's instances through api/db_rows.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from django.contrib.auth import get_user_model
from django.db import connections

from api.db_rows import RowShape, build, row_shape
from api.models import ApiKey


@dataclass(frozen=True)
class _Statement:
    sql: str
    key: RowShape
    owner: RowShape


def api_key_with_owner(*, hashed_key: str, using: str = "default") -> ApiKey | None:
    """The key whose secret hashes to ``hashed_key``, with ``owner`` loaded, or None."""
    statement = _statement(using)
    connection = connections[using]
    with connection.cursor() as cursor:
        cursor.execute(statement.sql, [hashed_key])
        row = cursor.fetchone()
    if row is None:
        return None
    api_key = build(statement.key, row[: statement.key.width], using)
    api_key.owner = build(statement.owner, row[statement.key.width:], using)
    return api_key


@cache
def _statement(using: str) -> _Statement:
    connection = connections[using]
    quote = connection.ops.quote_name
    user_model = get_user_model()
    key_shape, owner_shape = row_shape(ApiKey), row_shape(user_model)
    key_table, user_table = quote(ApiKey._meta.db_table), quote(user_model._meta.db_table)
    columns = f"{key_shape.column_list(quote, key_table)}, {owner_shape.column_list(quote, user_table)}"
    owner_column = quote(ApiKey._meta.get_field("owner").column)
    sql = (
        f"SELECT {columns} FROM {key_table} "
        f"INNER JOIN {user_table} ON {user_table}.{quote(user_model._meta.pk.column)} = {key_table}.{owner_column} "
        f"WHERE {key_table}.{quote(ApiKey._meta.get_field('hashed_key').column)} = %s"
    )
    return _Statement(sql=sql, key=key_shape, owner=owner_shape)
