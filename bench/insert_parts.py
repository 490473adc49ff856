"""What one submission's transaction waits for in PostgreSQL, piece by piece (diagnostics, not a
service path; PostgreSQL only).

    python bench/insert_parts.py [--rounds 150] [--listen] [--out FILE]
    on the GPU host: DB=postgres SCRIPT=bench/insert_parts.py bash bench/h200_service.sh --listen

A submission is one call: ``BEGIN``, the job's INSERT (returning its queue position), the key's
quota gate (migration 0004's ``api_key_gate``) and ``COMMIT`` (services/job_insert.py). Each round
runs every variant below once, in a shuffled order, each on a connection of its own, one at a time
(no burst), and the script prints every variant's median wall time in ms:

* ``select_1``: the round trip;
* ``bare_insert_commit``: a one-integer row and its COMMIT (the WAL flush);
* ``job_insert``: the job's INSERT and COMMIT, no queue position, no gate;
* ``job_insert_position``: with the queue position (the INSERT's ``RETURNING`` subquery);
* ``gate_only``: the gate in its own transaction, with no INSERT (nothing to flush);
* ``submission``: the real call;
* ``submission_async_commit``: the real call on a connection with ``synchronous_commit = off``;
* ``submission_no_triggers``: the real call on a connection with ``session_replication_role =
  replica``, which skips the NOTIFY trigger of migration 0003 and the deferred foreign-key checks.

``--listen`` keeps a connection LISTENing for the queued-job notices and draining them, as an
engine worker does. Uses the service benchmark's database (BENCH_DATABASE_URL, default
``service_bench`` on the local PostgreSQL); its jobs are deleted every 25 rounds and at the end.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import django_with_bench_key, dump_json_line, environment  # noqa: E402

VARIANTS = ("select_1", "bare_insert_commit", "job_insert", "job_insert_position", "gate_only", "submission",
            "submission_async_commit", "submission_no_triggers")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--listen", action="store_true", help="drain the queued-job notices meanwhile")
    parser.add_argument("--out", default=None, help="also append the final JSON line to this file")
    parser.add_argument("--model", default=None, help="ignored (h200_service.sh's SCRIPT= passes one)")
    args = parser.parse_args()

    owner, api_key, _ = django_with_bench_key("insert_parts")
    import psycopg
    from django.db import connection
    from django.utils import timezone

    from api.models import Job
    from api.services import job_insert
    from api.services.quotas import quota_gate_params, quota_gate_sql
    from api.streaming.queue_listener import CHANNEL
    url = os.environ["DATABASE_URL"].replace("postgres://", "postgresql://", 1)

    def connect(*settings: str) -> psycopg.Connection:
        conn = psycopg.Connection.connect(url, autocommit=True, cursor_factory=psycopg.ClientCursor)
        for statement in settings:
            conn.execute(statement)
        return conn

    def new_job() -> Job:
        now = timezone.now()
        return Job(owner=owner, api_key=api_key, prompt="x" * 200, prompt_token_ids=list(range(60)),
                   params={"max_tokens": 128, "temperature": 0.0}, prompt_tokens=60, priority=api_key.priority,
                   created_at=now, queued_at=now, dispatch_count=1)

    statement = job_insert._statement("default").sql
    insert_only = statement.split(" RETURNING ")[0]
    n_ahead = len(job_insert._insert_params(new_job(), "default")) - len(job_insert._statement("default").fields)

    def insert_params(job: Job) -> list:
        return job_insert._insert_params(job, "default")

    def submission_sql(job: Job) -> tuple[str, list]:
        gate = quota_gate_params(api_key_id=job.api_key_id, job_id=job.id, now=timezone.now())
        return f"BEGIN; {statement}; {quota_gate_sql()}; COMMIT", insert_params(job) + gate

    plain = connect()
    plain.execute("CREATE TABLE IF NOT EXISTS bench_insert_parts (n int)")
    conns = {name: connect() for name in VARIANTS}
    conns["submission_async_commit"] = connect("SET synchronous_commit = off")
    conns["submission_no_triggers"] = connect("SET session_replication_role = replica")

    def run(name: str) -> None:
        conn, job = conns[name], new_job()
        if name == "select_1":
            conn.execute("SELECT 1").fetchone()
        elif name == "bare_insert_commit":
            conn.execute("INSERT INTO bench_insert_parts VALUES (1)")
        elif name == "job_insert":
            conn.execute(f"BEGIN; {insert_only}; COMMIT", insert_params(job)[:-n_ahead])
        elif name == "job_insert_position":
            conn.execute(f"BEGIN; {statement}; COMMIT", insert_params(job))
        elif name == "gate_only":
            gate = quota_gate_params(api_key_id=job.api_key_id, job_id=job.id, now=timezone.now())
            conn.execute(f"BEGIN; {quota_gate_sql()}; COMMIT", gate)
        else:
            conn.execute(*submission_sql(job))

    stop = threading.Event()
    listener = threading.Thread(target=_drain, args=(connect, CHANNEL, stop), daemon=True) if args.listen else None
    if listener is not None:
        listener.start()
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    try:
        for name in VARIANTS:  # each connection's first statements plan and cache
            run(name)
        for round_no in range(args.rounds):
            for name in random.sample(VARIANTS, len(VARIANTS)):
                started = time.perf_counter()
                run(name)
                times[name].append(1000 * (time.perf_counter() - started))
                time.sleep(0.002)
            if round_no % 25 == 24:
                Job.objects.filter(owner=owner).delete()
    finally:
        stop.set()
        Job.objects.filter(owner=owner).delete()
        owner.delete()
        plain.execute("DROP TABLE IF EXISTS bench_insert_parts")
        for conn in [plain, *conns.values()]:
            conn.close()
        connection.close()
    p50 = {name: round(statistics.median(values), 3) for name, values in times.items()}
    for name, ms in p50.items():
        print(f"{name:26} {ms:7.3f} ms")
    dump_json_line({"bench": "insert_parts", "rounds": args.rounds, "listen": args.listen, "p50_ms": p50,
                    "env": environment()}, args.out)


def _drain(connect, channel: str, stop: threading.Event) -> None:
    with connect() as conn:
        conn.execute(f"LISTEN {channel}")
        while not stop.is_set():
            for _ in conn.notifies(timeout=0.2):
                pass


if __name__ == "__main__":
    main()
