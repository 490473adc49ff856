"""Compare the engine steps' cProfile of the engine worker with the in-process engine's, from a
run traced with WORKER_TRACE_PROFILE=1 (bench/trace_site; diagnostics, not a benchmark).

    python bench/step_profiles.py TRACE_DIR [--kind admit|decode] [--top 25]

For each side (worker-*, bench-*) and kind of step, prints the total profiled time and the
functions with the most time of their own (tottime) and in all (cumtime), in ms per step of that
kind.
"""

from __future__ import annotations

import argparse
import json
import pstats
from pathlib import Path


def step_counts(folder: Path, prefix: str) -> dict[str, int]:
    """Profiled steps of each kind (the profiler's own counts, prof-<prefix>-<pid>-steps.json)."""
    counts = {"admit": 0, "decode": 0}
    for path in folder.glob(f"prof-{prefix}-*-steps.json"):
        for kind, n in json.loads(path.read_text()).items():
            counts[kind] += n
    return counts


def show(folder: Path, prefix: str, kind: str, top: int) -> None:
    files = sorted(folder.glob(f"prof-{prefix}-*-{kind}.pstats"))
    if not files:
        print(f"{prefix}/{kind}: no profile")
        return
    stats = pstats.Stats(*map(str, files))
    steps = max(1, step_counts(folder, prefix)[kind])
    total = stats.total_tt * 1000
    print(f"\n== {prefix} / {kind}: {total:.0f} ms profiled over ~{steps} steps = {total / steps:.2f} ms per step")
    rows = []
    for (file, _line, name), (_cc, calls, tottime, cumtime, _callers) in stats.stats.items():
        short = f"{Path(file).parent.name}/{Path(file).name}:{name}" if file != "~" else name
        rows.append((tottime, cumtime, calls, short))
    for label, key in (("tottime", 0), ("cumtime", 1)):
        print(f"-- top by {label} (ms per step, calls per step)")
        for row in sorted(rows, key=lambda r: -r[key])[:top]:
            print(f"  {1000 * row[0] / steps:8.3f} {1000 * row[1] / steps:8.3f} {row[2] / steps:8.1f}  {row[3]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--kind", choices=["admit", "decode"], default=None)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    folder = Path(args.folder)
    for kind in [args.kind] if args.kind else ["admit", "decode"]:
        for prefix in ("bench", "worker"):
            show(folder, prefix, kind, args.top)


if __name__ == "__main__":
    main()
