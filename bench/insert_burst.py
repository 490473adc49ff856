"""A burst of real submissions of one API key (``job_insert_within_quota``: INSERT, quota gate,
COMMIT in one call), each from its own thread and database connection, with the queued-job
NOTIFY trigger of migration 0003 on and off (PostgreSQL only; diagnostics, not a service path).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/service_bench python bench/insert_burst.py [--rounds 12] [--listen]

``--listen`` keeps a connection LISTENing and draining the notices, as the worker's intake does.
Rounds alternate the two sides; the last line is JSON with each side's median per-call latency
(p50 and max over a burst of 32) and the ratio. The trigger is switched with ``ALTER TABLE ...
DISABLE TRIGGER``, so run it on a bench database, never on one a service uses.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inference_service.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/service_bench")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from api.models import ApiKey, Job  # noqa: E402
from api.services.api_keys import api_key_create  # noqa: E402
from api.services.job_insert import job_insert_within_quota  # noqa: E402

NOTIFY_TRIGGERS = ("api_job_queued_insert", "api_job_queued_requeue")


def burst(api_key: ApiKey, n: int) -> list[float]:
    barrier = threading.Barrier(n)
    took = [0.0] * n

    def one(i: int) -> None:
        ids = [random.randint(0, 2999) for _ in range(random.randint(40, 300))]
        job = Job(owner=api_key.owner, api_key=api_key, prompt="x", prompt_token_ids=ids, params={"max_tokens": 128},
                  request_fingerprint="f" * 64)
        connection.ensure_connection()  # connect before the clock starts
        barrier.wait()
        t = time.perf_counter()
        job_insert_within_quota(job, now=timezone.now())
        took[i] = time.perf_counter() - t
        connection.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    Job.objects.filter(api_key=api_key).delete()
    return took


def set_notify(enabled: bool) -> None:
    with connection.cursor() as cursor:
        for name in NOTIFY_TRIGGERS:
            cursor.execute(f"ALTER TABLE api_job {'ENABLE' if enabled else 'DISABLE'} TRIGGER {name}")


def listen_and_drain() -> None:
    import psycopg

    url = os.environ["DATABASE_URL"].replace("postgres://", "postgresql://", 1)
    listener = psycopg.connect(url, autocommit=True)
    listener.execute("LISTEN engine_jobs_queued")

    def drain() -> None:
        while True:
            for _ in listener.notifies(timeout=0.5):
                pass

    threading.Thread(target=drain, daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--listen", action="store_true")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    owner = get_user_model().objects.create(username=f"insert-burst-{os.getpid()}")
    api_key, _secret = api_key_create(owner=owner, name="insert-burst", max_concurrent_jobs=10**6, tokens_per_day=10**12)
    if args.listen:
        listen_and_drain()
    sides = {"notify": True, "no_notify": False}
    results: dict[str, dict[str, list[float]]] = {side: {"p50": [], "max": []} for side in sides}
    try:
        burst(api_key, args.burst)  # warm-up
        for _ in range(args.rounds):
            for side, enabled in sides.items():
                set_notify(enabled)
                took = burst(api_key, args.burst)
                results[side]["p50"].append(1000 * statistics.median(took))
                results[side]["max"].append(1000 * max(took))
    finally:
        set_notify(True)
        Job.objects.filter(api_key=api_key).delete()
        owner.delete()
    summary = {side: {k: round(statistics.median(v), 2) for k, v in r.items()} for side, r in results.items()}
    for side, s in summary.items():
        print(f"{side:10} call p50 {s['p50']:7.2f} ms   max {s['max']:7.2f} ms (medians of {args.rounds} bursts)")
    print(json.dumps({"bench": "insert_burst", "burst": args.burst, "rounds": args.rounds, "listen": args.listen,
                      **summary, "p50_notify_over_none": round(summary["notify"]["p50"] / summary["no_notify"]["p50"], 3)}))


if __name__ == "__main__":
    main()
