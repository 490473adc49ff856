"""Model instances from the rows of hand-written SQL, exactly as the ORM builds them.

The hot paths (the key lookup of every request, a worker's claim) run statements built once from
the models' own field lists. Their rows go through the converters the ORM applies (SQLite's
datetimes arrive as text, for one) and ``Model.from_db``, so the instances are the ORM's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.db.models import Field, Model


@dataclass(frozen=True)
class RowShape:
    """A model's concrete fields in column order: what a ``SELECT``/``RETURNING`` of
    :meth:`column_list` gives back."""

    model: type[Model]
    fields: list[Field]
    columns: list[Any]  # the fields' Col expressions, which converters receive
    attnames: list[str]
    width: int

    def column_list(self, quote: Any, table: str | None = None) -> str:
        """The columns, quoted with ``quote`` (``connection.ops.quote_name``), each prefixed with
        ``table.`` when given."""
        prefix = f"{table}." if table else ""
        return ", ".join(f"{prefix}{quote(f.column)}" for f in self.fields)


def row_shape(model: type[Model]) -> RowShape:
    fields: list[Field] = list(model._meta.concrete_fields)
    return RowShape(model=model, fields=fields, columns=[f.get_col(model._meta.db_table) for f in fields],
                    attnames=[f.attname for f in fields], width=len(fields))


def build(shape: RowShape, values: tuple[Any, ...] | list[Any], using: str = "default") -> Model:
    """The instance the ORM would make of ``values`` (one row in ``shape``'s column order)."""
    # Converters come from this thread's connection (connections are per thread).
    connection = connections[using]
    converted = []
    for value, field, column in zip(values, shape.fields, shape.columns, strict=True):
        for convert in connection.ops.get_db_converters(column) + field.get_db_converters(connection):
            value = convert(value, column, connection)
        converted.append(value)
    return shape.model.from_db(using, shape.attnames, converted)
