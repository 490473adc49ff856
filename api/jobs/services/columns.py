"""The job table's fields and columns, for the raw SQL of the claim and of the output writes."""

from __future__ import annotations

from django.core.exceptions import FieldDoesNotExist
from django.db import connection
from django.db.models import Field

from api.models import Job


def job_field(name: str) -> Field:
    """Job's field ``name`` (``_meta.get_field`` also finds reverse relations, which are no field
    of the table)."""
    field = Job._meta.get_field(name)
    if not isinstance(field, Field):
        raise FieldDoesNotExist(f"Job.{name} is not a field of the job table")
    return field


def job_column(name: str) -> str:
    """The job table's column of field ``name``, quoted for the default connection."""
    column = job_field(name).column
    if column is None:
        raise FieldDoesNotExist(f"Job.{name} has no column")
    return connection.ops.quote_name(column)
