"""Print an engine worker's timeline from bench/trace_site's trace (diagnostics, not a benchmark).

    python bench/worker_timeline.py TRACE_DIR [--round N]
    python bench/worker_timeline.py TRACE_DIR --steps

``--steps`` compares engine steps instead: the worker's (worker-*.jsonl) against the in-process
engine's of service_bench.py in the same run (bench-*.jsonl), split into decode-only steps (no
new commands, every running request gave an output) and the others (prefill, admission); with a
trace taken with WORKER_TRACE_PARTS=1, also the mean ms per step of each piece of the steps.

A round starts at a hand-over 0.3 s or more after the previous one. For the chosen round (default: the last),
every event is printed with its offset in ms from the round's first Celery hand-over, and then a
summary: hand-overs, admission batches, claims, steps (their length and the gaps between them)
and publishes with first tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def load(folder: str, prefix: str = "worker") -> list[dict]:
    events = [json.loads(line) for path in Path(folder).glob(f"{prefix}-*.jsonl") for line in path.open()]
    return sorted(events, key=lambda e: e.get("t0", e["t"]))


def rounds(events: list[dict]) -> list[list[dict]]:
    out: list[list[dict]] = []
    last_handover = None
    for e in events:
        if e["k"] == "handover":
            if last_handover is None or e["t"] - last_handover > 0.3:
                out.append([])
            last_handover = e["t"]
        if out:
            out[-1].append(e)
    return out


def show(events: list[dict]) -> None:
    start = min(e["t"] for e in events if e["k"] == "handover")
    ms = lambda t: round(1000 * (t - start), 1)  # noqa: E731
    for e in events:
        extra = {k: v for k, v in e.items() if k not in ("t", "t0", "k", "th", "job")}
        span = f"{ms(e['t0']):8.1f}-{ms(e['t']):8.1f}" if "t0" in e else f"{'':9}{ms(e['t']):8.1f}"
        print(f"{span}  {e['th'][:16]:16} {e['k']:12} {extra}")
    steps = [e for e in events if e["k"] == "step"]
    firsts = [e for e in events if e["k"] == "publish" and e["first"]]
    print("hand-overs", sum(e["k"] == "handover" for e in events), "from", ms(start), "to",
          ms(max(e["t"] for e in events if e["k"] == "handover")))
    print("submits", sum(e["k"] == "submit" for e in events), "last at",
          ms(max((e["t"] for e in events if e["k"] == "submit"), default=start)))
    lengths = [1000 * (e["t"] - e["t0"]) for e in steps]
    gaps = [1000 * (b["t0"] - a["t"]) for a, b in zip(steps, steps[1:], strict=False)]
    if lengths:
        print(f"steps {len(steps)}: length p50 {statistics.median(lengths):.2f} ms max {max(lengths):.2f}; "
              f"gap p50 {statistics.median(gaps or [0]):.2f} max {max(gaps or [0]):.2f}")
    for e in firsts:
        print(f"first tokens: {e['first']:3} published at {ms(e['t0'])} ms")


def step_summary(folder: str) -> None:
    for prefix in ("bench", "worker"):
        steps = [e for e in load(folder, prefix) if e["k"] == "step" and e["outs"]]
        decode, other = [], []
        for e in steps:
            (decode if not e["cmds"] and e["outs"] == e["running"] else other).append(e)
        for name, group in (("decode", decode), ("other", other)):
            if not group:
                continue
            wall = sorted(1000 * (e["t"] - e["t0"]) for e in group)
            cpu = sorted(e["cpu_ms"] for e in group)
            print(f"{prefix:6} {name:6} steps {len(group):5}  wall p50 {statistics.median(wall):6.2f} "
                  f"p90 {wall[int(0.9 * (len(wall) - 1))]:6.2f} ms  cpu p50 {statistics.median(cpu):6.2f} ms")
            parts: dict[str, float] = {}
            for e in group:
                for label, ms in e.get("parts", {}).items():
                    parts[label] = parts.get(label, 0.0) + ms
            if parts:  # WORKER_TRACE_PARTS: mean ms per step of each piece (inclusive where they nest)
                mean_cmds = sum(e["cmds"] for e in group) / len(group)
                print(f"{'':14}cmds {mean_cmds:.1f}/step; " + ", ".join(
                    f"{label} {ms / len(group):.2f}" for label, ms in sorted(parts.items(), key=lambda kv: -kv[1])))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--round", type=int, default=-1)
    parser.add_argument("--steps", action="store_true", help="compare the worker's engine steps with the bench's")
    args = parser.parse_args()
    if args.steps:
        step_summary(args.folder)
        return
    found = rounds(load(args.folder))
    print(f"{len(found)} rounds")
    show(found[args.round])


if __name__ == "__main__":
    main()
