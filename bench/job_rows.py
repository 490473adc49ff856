"""The service's job rows, read straight from its database by the benchmarks (no Django)."""

from __future__ import annotations

import datetime as dt
import sqlite3


def job_rows(db: str, columns: list[str], where: str = "") -> list[tuple]:
    """``columns`` of every ``api_job`` row (``where``: an SQL condition), from ``db``: a SQLite file,
    a ``sqlite:///`` URL or a ``postgresql://`` URL. The ``*_at`` columns come as UTC datetimes
    (None where unset), from either database."""
    sql = f"SELECT {', '.join(columns)} FROM api_job" + (f" WHERE {where}" if where else "")
    if db.startswith("postgres"):
        import psycopg

        with psycopg.connect(db) as conn:
            return [tuple(row) for row in conn.execute(sql)]
    with sqlite3.connect(db.removeprefix("sqlite:///")) as conn:
        rows = conn.execute(sql).fetchall()
    times = [column.endswith("_at") for column in columns]
    return [tuple(dt.datetime.fromisoformat(v).replace(tzinfo=dt.UTC) if is_time and v else v
                  for v, is_time in zip(row, times, strict=True)) for row in rows]
