"""The quota gate's usage query with a busy key: the day's sum (before) against KeyDayTokens (now).

Every submission runs this query inside its key's row lock, so its time is also how long the
key's other submissions wait. Before, it summed the key's jobs of the day; on PostgreSQL it now
reads one KeyDayTokens row and sums only the key's queued and running jobs.

    python bench/quota_gate_bench.py [--jobs 100000] [--repeats 15]

Needs PostgreSQL on 127.0.0.1:5432 (trust auth): it creates and migrates a ``quota_bench``
database, gives one key ``--jobs`` finished jobs created today and 32 active ones, then times
both queries, interleaved, and prints the medians and their ratio as the last line (JSON).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS quota_bench")
        conn.execute("CREATE DATABASE quota_bench")
    os.environ["DATABASE_URL"] = "postgres://postgres@127.0.0.1:5432/quota_bench"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inference_service.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from api.models import JobStatus
    from api.services import quotas
    from bench.common import dump_json_line, environment, median
    from tests.api.factories import make_api_key, make_job

    call_command("migrate", verbosity=0)
    api_key, _ = make_api_key()
    template = make_job(api_key=api_key, status=JobStatus.COMPLETED, prompt_tokens=10, completion_tokens=100)
    for _ in range(32):
        make_job(api_key=api_key)
    with connection.cursor() as cursor:  # copies of the finished job (the trigger counts them)
        cursor.execute(
            "INSERT INTO api_job SELECT (jsonb_populate_record(NULL::api_job, to_jsonb(j) || "
            "jsonb_build_object('id', gen_random_uuid()))).* FROM api_job j, generate_series(1, %s) "
            "WHERE j.id = %s", [args.jobs - 1, template.id])
        cursor.execute("VACUUM ANALYZE api_job")
        cursor.execute("VACUUM ANALYZE api_keydaytokens")  # the bulk copy updated its row 100,000 times

    now = timezone.now()
    start = quotas._day_bounds(now)[0]
    prompt_len, max_tokens = quotas._JSON_SQL["postgresql"]
    active = ", ".join(f"'{s}'" for s in ("queued", "in_progress"))
    day_sum = quotas._KEY_USAGE_SQL["sqlite"].format(active=active, prompt_len=prompt_len, max_tokens=max_tokens,
                                                      table="api_job")
    sides = {
        "day_sum": (day_sum, [start, api_key.id, start]),
        "counter": (quotas._key_usage_sql(), quotas._key_usage_params(api_key_id=api_key.id, now=now)),
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    answers = {}
    with connection.cursor() as cursor:
        for _ in range(args.repeats):
            for name, (sql, params) in sides.items():
                t0 = time.perf_counter()
                cursor.execute(sql, params)
                answers[name] = tuple(int(v) for v in cursor.fetchone())
                times[name].append(time.perf_counter() - t0)
    assert answers["day_sum"] == answers["counter"], answers
    result = {
        "bench": "quota_gate", "jobs_today": args.jobs, "active_jobs": 32, "usage": answers["counter"],
        **{f"{name}_ms_p50": round(1000 * median(ts), 3) for name, ts in times.items()},
        "day_sum_over_counter": round(median(times["day_sum"]) / median(times["counter"]), 1),
        "env": environment(),
    }
    print(f"day sum {result['day_sum_ms_p50']} ms, counter {result['counter_ms_p50']} ms", flush=True)
    dump_json_line(result, args.out)


if __name__ == "__main__":
    main()
