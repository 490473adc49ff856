"""The phases of the time to first token, from bench/probes/probe_job_marks.py's files: one table, p50 per phase.

Reads ``<prefix>.<pid>.jsonl`` (each process's per-job points), ``<prefix>.client.jsonl`` (peer_bench's
client: when it sent each request and saw its first text) and, with ``--db``, the service's SQLite
or PostgreSQL database (the job rows' ``queued_at`` and ``started_at``, the claim). Prints, for the service's jobs
that passed every point, the median of each step from one point to the next, and for the engine
alone (bench/engine_loop.py under the same probe) the same steps of its own requests.

    PYTHONPATH=bench/probes TTFT_PROBE=/tmp/ttft/p python bench/peer_bench.py --servers ours,engine \\
        --concurrency 8 --batch 8 --rounds 3 --one-token 0 --max-tokens 32 --out /tmp/ttft/out
    python bench/ttft_phases.py /tmp/ttft/p --db /tmp/ttft/out/ours.sqlite3
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics

from job_rows import job_rows

# The service's path, in order. "sent" and "first_text" are the client's; "queued" (the job's
# build, before its insert waits for the database) and "started" (the claim's start) the job row's.
SERVICE = ["sent", "web_open", "submit_start", "queued", "admission", "dispatch", "committed", "started", "claimed", "admit_sent", "admit_recv", "engine_submit", "add_request",
           "step_start", "inserted", "gen_start", "first_token", "listener", "folded", "pipe_sent", "parent_recv", "redis",
           "relay", "first_text"]
# The row's way to its claim, for the jobs their own message claimed (the others were claimed
# with an earlier job's message, before theirs was received).
OWN_MESSAGE = ["queued", "admission", "dispatch", "committed", "received", "started", "claimed"]
GROUPED = ["claimed", "admit_sent", "add_request", "inserted", "first_token"]
ENGINE = ["engine_submit", "add_request", "step_start", "inserted", "gen_start", "first_token", "listener"]


def load(prefix: str, db: str | None) -> dict[str, dict[str, float]]:
    marks: dict[str, dict[str, float]] = {}
    for path in glob.glob(f"{prefix}.[0-9]*.jsonl"):
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                for job_id in row["jobs"]:
                    points = marks.setdefault(job_id, {})
                    points.setdefault(row["point"], row["at"])
                    if "step" in row:  # the engine thread's step number, kept apart from the times
                        points.setdefault(f"#{row['point']}", row["step"])
                    if "running" in row:
                        points.setdefault("#running", row["running"])
    try:
        with open(f"{prefix}.client.jsonl") as f:
            for line in f:
                row = json.loads(line)
                job_id = (row["id"] or "").split("-", 1)[-1]
                marks.setdefault(job_id, {}).update(sent=row["sent"], first_text=row["first_text"])
    except FileNotFoundError:
        pass
    for job_id, queued, started in _job_rows(db) if db else ():
        key = str(job_id) if "-" in str(job_id) else _uuid(str(job_id))
        if key in marks:
            marks[key].update({k: v for k, v in (("queued", queued), ("started", started)) if v})
    return marks


def _job_rows(db: str) -> list[tuple[str, float | None, float | None]]:
    """(id, queued_at, started_at) of every job, the times as Unix seconds; ``db`` a SQLite file or
    a ``postgresql://`` URL."""
    return [(str(i), *(v.timestamp() if v else None for v in times))
            for i, *times in job_rows(db, ["id", "queued_at", "started_at"])]


def _uuid(hex_id: str) -> str:
    return f"{hex_id[:8]}-{hex_id[8:12]}-{hex_id[12:16]}-{hex_id[16:20]}-{hex_id[20:]}"


def table(rows: list[dict[str, float]], points: list[str], title: str) -> None:
    points = [p for p in points if any(p in r for r in rows)]
    full = [r for r in rows if all(p in r for p in points)]
    print(f"{title}: {len(full)} of {len(rows)} requests passed every point")
    if not full:
        return
    for a, b in zip(points, points[1:], strict=False):
        gaps = [1000 * (r[b] - r[a]) for r in full]
        print(f"  {a:>13} -> {b:<13} p50 {statistics.median(gaps):7.1f} ms   p90 {_q(gaps, 0.9):7.1f} ms")
    total = [1000 * (r[points[-1]] - r[points[0]]) for r in full]
    print(f"  {points[0]:>13} -> {points[-1]:<13} p50 {statistics.median(total):7.1f} ms   (whole)")
    steps = [r["#first_token"] - r["#step_start"] for r in full if "#first_token" in r and "#step_start" in r]
    if steps:
        print(f"  engine steps from the inserting step to the first token's: p50 {statistics.median(steps)}, "
              f"max {max(steps)}; running at the first token p50 {statistics.median(r['#running'] for r in full)}")


def group_sizes(prefix: str) -> None:
    """How many jobs passed each point together (one line of a probe file is one call), per process:
    whether the claim, the Admit and the generator's insert take jobs in groups or one by one."""
    for path in sorted(glob.glob(f"{prefix}.[0-9]*.jsonl")):
        sizes: dict[str, list[int]] = {}
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                sizes.setdefault(row["point"], []).append(len(row["jobs"]))
        shown = [p for p in GROUPED if p in sizes]
        if shown:
            print(f"jobs per call, {path}: " + ", ".join(
                f"{p} {len(sizes[p])} calls, p50 {statistics.median(sizes[p])}, mean {statistics.fmean(sizes[p]):.1f}"
                for p in shown))


def _q(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prefix", help="TTFT_PROBE's prefix")
    parser.add_argument("--db", default=None, help="the service's database: peer_bench --out's ours_b<batch>.sqlite3, or for ourspg "
                        "postgresql://postgres@127.0.0.1:5432/peer_ourspg_b<batch>")
    args = parser.parse_args()
    marks = load(args.prefix, args.db)
    service = [m for m in marks.values() if "claimed" in m]
    engine = [m for m in marks.values() if "claimed" not in m and "admit_recv" not in m and "engine_submit" in m]
    table(service, SERVICE, "service")
    table(service, OWN_MESSAGE, "the row to its claim")
    table(service, ENGINE, "the service's engine (the same points as the engine alone's)")
    table(engine, ENGINE, "engine alone")
    group_sizes(args.prefix)


if __name__ == "__main__":
    main()
