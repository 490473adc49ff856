"""Reads of API keys: the key behind a secret's hash, with its owner, in one prepared statement.

Every request and every WebSocket connect authenticates, and the ORM's
``ApiKey.objects.select_related("owner").filter(hashed_key=...)`` recompiled the same JOIN each
time: about 1.5 ms of CPU per call on the 2-core machine, most of it building SQL that never
changes. The statement here is built once per database alias from the models' own field lists,
and its rows become model instances through ``Model.from_db`` after the same converters the ORM
applies (SQLite's datetimes arrive as text, for one), so the instances are the ORM's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connections
from django.db.models import Field, Model

from api.models import ApiKey


@dataclass(frozen=True)
class _Part:
    model: type[Model]
    fields: list[Field]
    columns: list[Any]  # the fields' Col expressions, which converters receive
    attnames: list[str]
    width: int


@dataclass(frozen=True)
class _Statement:
    sql: str
    key: _Part
    owner: _Part


def api_key_with_owner(*, hashed_key: str, using: str = "default") -> ApiKey | None:
    """The key whose secret hashes to ``hashed_key``, with ``owner`` loaded, or None."""
    statement = _statement(using)
    connection = connections[using]
    with connection.cursor() as cursor:
        cursor.execute(statement.sql, [hashed_key])
        row = cursor.fetchone()
    if row is None:
        return None
    api_key = _build(statement.key, row[: statement.key.width], using)
    api_key.owner = _build(statement.owner, row[statement.key.width:], using)
    return api_key


def _build(part: _Part, values: tuple[Any, ...], using: str) -> Model:
    # Converters come from this thread's connection (connections are per thread).
    connection = connections[using]
    converted = []
    for value, field, column in zip(values, part.fields, part.columns, strict=True):
        for convert in connection.ops.get_db_converters(column) + field.get_db_converters(connection):
            value = convert(value, column, connection)
        converted.append(value)
    return part.model.from_db(using, part.attnames, converted)


@cache
def _statement(using: str) -> _Statement:
    connection = connections[using]
    quote = connection.ops.quote_name
    user_model = get_user_model()
    key_part, owner_part = _part(ApiKey), _part(user_model)
    key_table, user_table = quote(ApiKey._meta.db_table), quote(user_model._meta.db_table)
    columns = [f"{key_table}.{quote(f.column)}" for f in ApiKey._meta.concrete_fields]
    columns += [f"{user_table}.{quote(f.column)}" for f in user_model._meta.concrete_fields]
    owner_column = quote(ApiKey._meta.get_field("owner").column)
    sql = (
        f"SELECT {', '.join(columns)} FROM {key_table} "
        f"INNER JOIN {user_table} ON {user_table}.{quote(user_model._meta.pk.column)} = {key_table}.{owner_column} "
        f"WHERE {key_table}.{quote(ApiKey._meta.get_field('hashed_key').column)} = %s"
    )
    return _Statement(sql=sql, key=key_part, owner=owner_part)


def _part(model: type[Model]) -> _Part:
    fields: list[Field] = list(model._meta.concrete_fields)
    return _Part(model=model, fields=fields, columns=[f.get_col(model._meta.db_table) for f in fields],
                 attnames=[f.attname for f in fields], width=len(fields))
