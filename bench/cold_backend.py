"""What a database backend's first submission costs, and what the web warm-up's rehearsal of it
saves (diagnostics, not the issue's benchmark; PostgreSQL only).

    python bench/cold_backend.py [--rounds 60] [--out FILE]

Each round opens a new connection (a new PostgreSQL backend) per side, in a shuffled order, and
times one real submission on it (``job_insert_within_quota``: the job's INSERT, the key's gate,
the COMMIT, in one call), after:

* ``cold``: nothing (the backend's first submission);
* ``rehearsed_once``: one ``job_insert_rehearsal`` (rolled back);
* ``rehearsed``: ``job_insert_rehearsal()`` as the warm-up runs it (``REHEARSALS`` times);
* ``warm``: six real submissions (a backend that has served for a while).

The last line is JSON with each side's median wall time in ms and its ratio to ``warm``. Uses the
service benchmark's database (BENCH_DATABASE_URL, default ``service_bench`` on the local
PostgreSQL); its jobs are deleted every 10 rounds and at the end.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import django_with_bench_key, dump_json_line, environment  # noqa: E402

SIDES = ("cold", "rehearsed_once", "rehearsed", "warm")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--out", default=None, help="also append the final JSON line to this file")
    args = parser.parse_args()

    owner, api_key, _ = django_with_bench_key("cold_backend")
    from django.db import connection
    from django.utils import timezone

    from api.models import Job
    from api.services.job_insert import job_insert_rehearsal, job_insert_within_quota

    def submit() -> None:
        job = Job(owner=owner, api_key=api_key, prompt="x" * 200, prompt_token_ids=list(range(60)),
                  params={"max_tokens": 128, "temperature": 0.0}, priority=api_key.priority, dispatch_count=1)
        job_insert_within_quota(job, now=timezone.now())

    before = {"cold": lambda: None, "rehearsed_once": lambda: job_insert_rehearsal(times=1),
              "rehearsed": job_insert_rehearsal, "warm": lambda: [submit() for _ in range(6)]}
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    try:
        for round_no in range(args.rounds):
            for side in random.sample(SIDES, len(SIDES)):
                connection.close()
                connection.ensure_connection()  # a new backend
                before[side]()
                started = time.perf_counter()
                submit()
                times[side].append(1000 * (time.perf_counter() - started))
            if round_no % 10 == 9:
                Job.objects.filter(owner=owner).delete()
    finally:
        Job.objects.filter(owner=owner).delete()
        owner.delete()
        connection.close()
    p50 = {side: round(statistics.median(values), 3) for side, values in times.items()}
    for side, ms in p50.items():
        print(f"{side:16} {ms:7.3f} ms  {ms / p50['warm']:5.2f}x warm")
    dump_json_line({"bench": "cold_backend", "rounds": args.rounds, "p50_ms": p50,
                    "over_warm": {side: round(ms / p50["warm"], 3) for side, ms in p50.items()},
                    "env": environment()}, args.out)


if __name__ == "__main__":
    main()
