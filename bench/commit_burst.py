"""A burst of submissions of one API key against PostgreSQL: how long each one's transaction takes
when every one of them locks the key's row (as the quota gate does), committed two ways:

* ``sync``: the transaction commits synchronously, so the row lock is held through the WAL flush
  and the burst's flushes happen one after another;
* ``async+flush``: the transaction commits with ``synchronous_commit`` off (its lock goes at once),
  and a second transaction in the same call writes one WAL record and commits synchronously, which
  flushes the WAL past the first one's commit before the call returns. The flushes of concurrent
  submissions then overlap (PostgreSQL's group commit).

    python bench/commit_burst.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres] [--burst 32] [--rounds 15]

Rounds alternate the two ways; the last line is JSON with each way's median per-call latency
(p50 and max over the burst) and the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import psycopg

SETUP = """
DROP TABLE IF EXISTS commit_burst_job, commit_burst_key;
CREATE TABLE commit_burst_key (id int PRIMARY KEY, n int NOT NULL DEFAULT 0);
INSERT INTO commit_burst_key VALUES (1, 0);
CREATE TABLE commit_burst_job (id bigserial PRIMARY KEY, key_id int NOT NULL, payload text NOT NULL);
"""
INSERT = "INSERT INTO commit_burst_job (key_id, payload) VALUES (1, repeat('x', 400))"
GATE = "SELECT id FROM commit_burst_key WHERE id = 1 FOR UPDATE; SELECT count(*) FROM commit_burst_job WHERE key_id = 1"
WAYS = {
    "sync": f"BEGIN; {INSERT}; {GATE}; COMMIT",
    "async+flush": (f"BEGIN; SET LOCAL synchronous_commit TO off; {INSERT}; {GATE}; COMMIT; "
                    "BEGIN; SELECT pg_current_xact_id(); SELECT pg_logical_emit_message(false, 'flush', ''); COMMIT"),
}


def burst(conns: list[psycopg.Connection], sql: str) -> list[float]:
    barrier = threading.Barrier(len(conns))
    took = [0.0] * len(conns)

    def one(i: int) -> None:
        barrier.wait()
        t = time.perf_counter()
        conns[i].execute(sql)
        took[i] = time.perf_counter() - t

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(conns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--burst", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(SETUP)
    conns = [psycopg.connect(args.dsn, autocommit=True) for _ in range(args.burst)]
    results: dict[str, dict[str, list[float]]] = {way: {"p50": [], "max": []} for way in WAYS}
    try:
        for sql in WAYS.values():  # warm-up
            burst(conns, sql)
        for _ in range(args.rounds):
            for way, sql in WAYS.items():
                took = burst(conns, sql)
                results[way]["p50"].append(1000 * statistics.median(took))
                results[way]["max"].append(1000 * max(took))
    finally:
        for c in conns:
            c.close()
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute("DROP TABLE IF EXISTS commit_burst_job, commit_burst_key")
    summary = {way: {k: round(statistics.median(v), 2) for k, v in r.items()} for way, r in results.items()}
    for way, s in summary.items():
        print(f"{way:12} call p50 {s['p50']:7.2f} ms   max {s['max']:7.2f} ms (medians of {args.rounds} bursts of {args.burst})")
    print(json.dumps({"bench": "commit_burst", "burst": args.burst, "rounds": args.rounds, **summary,
                      "p50_async_over_sync": round(summary["async+flush"]["p50"] / summary["sync"]["p50"], 3),
                      "max_async_over_sync": round(summary["async+flush"]["max"] / summary["sync"]["max"], 3)}))


if __name__ == "__main__":
    main()
