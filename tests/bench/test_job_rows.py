"""bench/job_rows.py: the job rows' times read alike from SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import sqlite3
import sys
import uuid
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from job_rows import job_rows  # noqa: E402

QUEUED = dt.datetime(2026, 12, 6, 18, 0, 0, 250000, tzinfo=dt.UTC)


def test_sqlite_rows_come_with_utc_times_and_the_condition_applies(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    with sqlite3.connect(path) as db:  # Django's SQLite stores datetimes as naive UTC text
        db.execute("CREATE TABLE api_job (id TEXT, queued_at TEXT, started_at TEXT)")
        db.execute("INSERT INTO api_job VALUES ('a1', '2026-12-06 18:00:00.250000', NULL)")
        db.execute("INSERT INTO api_job VALUES ('b2', '2026-12-06 18:00:00.250000', '2026-12-06 18:00:01')")
    assert sorted(job_rows(str(path), ["id", "queued_at", "started_at"])) == [
        ("a1", QUEUED, None), ("b2", QUEUED, QUEUED.replace(second=1, microsecond=0))]
    assert job_rows(f"sqlite:///{path}", ["id"], "started_at IS NOT NULL") == [("b2",)]


def test_postgresql_rows_come_with_the_same_times() -> None:
    name = f"bench_job_rows_{uuid.uuid4().hex[:8]}"
    server = "postgresql://postgres@127.0.0.1:5432"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        with psycopg.connect(f"{server}/{name}") as db:
            db.execute("CREATE TABLE api_job (id uuid, queued_at timestamptz, started_at timestamptz)")
            db.execute("INSERT INTO api_job VALUES (%s, %s, NULL)", (uuid.UUID(int=1), QUEUED))
        assert job_rows(f"{server}/{name}", ["id", "queued_at", "started_at"]) == [(uuid.UUID(int=1), QUEUED, None)]
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
