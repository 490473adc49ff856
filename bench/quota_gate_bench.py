"""The quota gate's usage count (api/keys/quotas.py ``_usage``) against a key's day of jobs.

The gate counts a key's queued and running jobs and its tokens of the day on every submission,
while it holds the key's lock (on SQLite, the database's write lock, which every writer of the
service waits for). A fresh SQLite database, migrated, gets ``--jobs`` finished jobs of one key
created today, each with a prompt of ``--prompt-tokens`` tokens (the rows' size, as the service
stores them), and ``--active`` queued ones. Then ``--rounds`` rounds, each timing ``--repeats``
calls of this tree's statement and of the statement before it (one query over the key's rows of
the day, which read every row), interleaved. Prints the medians and the ratio; the LAST line is
one JSON object.

    python bench/quota_gate_bench.py [--jobs 1000,20000] [--prompt-tokens 500] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from common import dump_json_line  # noqa: E402

# The baseline this bench times against: one pass over the key's rows of the day.
BEFORE_SQL = """
SELECT j.active + h.active, j.tokens + h.tokens
FROM (SELECT
  COUNT(CASE WHEN status IN ({active}) AND batch_id IS NULL THEN 1 END) AS active,
  COALESCE(SUM(CASE
    WHEN created_at < %s THEN 0
    WHEN status = 'queued' AND batch_id IS NOT NULL AND dispatch_count = 0 THEN 0
    WHEN status IN ({active}) THEN json_array_length(prompt_token_ids) + CAST(json_extract(params, '$.max_tokens') AS integer)
    ELSE prompt_tokens + completion_tokens END), 0) AS tokens
  FROM api_job
  WHERE api_key_id = %s AND (status IN ({active}) OR created_at >= %s)) j,
 (SELECT COUNT(*) AS active, COALESCE(SUM(tokens), 0) AS tokens FROM api_quotahold WHERE api_key_id = %s) h
"""


def setup_database(path: str) -> None:
    os.environ["DATABASE_URL"] = f"sqlite:///{path}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inference_service.settings")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def fill(key_id: int | None, jobs: int, active: int, prompt_tokens: int) -> int:
    """Add ``jobs`` finished and ``active`` queued jobs to the key (a new one if None); its id."""
    from django.contrib.auth.models import User

    from api.keys.services import api_key_create
    from api.models import ApiKey, Job, JobStatus

    if key_id is None:
        key, _secret = api_key_create(owner=User.objects.create(username="gate"), name="gate")
    else:
        key = ApiKey.objects.get(id=key_id)
    user = key.owner
    prompt = list(range(1000, 1000 + prompt_tokens))
    params = {"max_tokens": 64}

    def job(status: str) -> Job:
        return Job(owner=user, api_key=key, model="tiny", status=status, prompt="x" * (4 * prompt_tokens),
                   prompt_token_ids=prompt, params=params, prompt_tokens=prompt_tokens, completion_tokens=64)

    Job.objects.bulk_create([job(JobStatus.COMPLETED) for _ in range(jobs)], batch_size=2000)
    Job.objects.bulk_create([job(JobStatus.QUEUED) for _ in range(active)])
    return key.id


def timed(call, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", default="1000,20000", help="finished jobs of the key today, per level")
    parser.add_argument("--active", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        setup_database(str(Path(folder) / "gate.sqlite3"))
        import datetime as dt

        from django.db import connection
        from django.utils import timezone

        from api.keys import quotas
        from api.models import ACTIVE_STATUSES

        active = ", ".join(f"'{status.value}'" for status in ACTIVE_STATUSES)
        before_sql = BEFORE_SQL.format(active=active)
        levels, filled = [], 0
        key_id = None
        for jobs in sorted(int(n) for n in args.jobs.split(",")):  # one key, its day growing level by level
            key_id = fill(key_id, jobs - filled, args.active if key_id is None else 0, args.prompt_tokens)
            filled = jobs
            now = timezone.now()
            start = connection.ops.adapt_datetimefield_value(now.astimezone(dt.UTC).replace(
                hour=0, minute=0, second=0, microsecond=0))

            def this(key_id: int = key_id, now: dt.datetime = now) -> tuple[int, int]:
                return quotas._usage(api_key_id=key_id, now=now)

            def before(key_id: int = key_id, start: str = start) -> tuple[int, int]:
                with connection.cursor() as cursor:
                    cursor.execute(before_sql, [start, key_id, start, key_id])
                    return cursor.fetchone()

            assert tuple(this()) == tuple(before()), (this(), before())  # the same figures
            runs: dict[str, list[float]] = {"this": [], "before": []}
            for _ in range(args.rounds):
                runs["before"].append(timed(before, args.repeats))
                runs["this"].append(timed(this, args.repeats))
            row = {"jobs": jobs, "ms_this": round(statistics.median(runs["this"]), 3),
                   "ms_before": round(statistics.median(runs["before"]), 3),
                   "ms_this_runs": [round(v, 3) for v in runs["this"]],
                   "ms_before_runs": [round(v, 3) for v in runs["before"]]}
            row["this_over_before"] = round(row["ms_this"] / row["ms_before"], 3)
            levels.append(row)
            print(f"{jobs:>7} jobs today: this {row['ms_this']:.2f} ms, before {row['ms_before']:.2f} ms, "
                  f"this / before {row['this_over_before']}", flush=True)
    dump_json_line({"levels": levels, "args": vars(args)}, args.out)


if __name__ == "__main__":
    main()
