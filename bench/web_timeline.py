"""Print the web tier's timeline of POST /api/v1/jobs bursts from bench/trace_site's web-*.jsonl
(diagnostics, not a benchmark).

    python bench/web_timeline.py TRACE_DIR [--round N]

A round starts at a connection made 0.3 s or more after the previous one. For the chosen round
(default: the last) every POST is printed with its marks in ms from the round's first connection,
then the median of each stage and how many POSTs each daphne process took.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path

MARKS = ("made", "app", "respond", "authed", "view", "tokenized", "rate", "inserted", "published", "end")


def load(folder: str) -> list[dict]:
    posts = []
    for path in Path(folder).glob("web-*.jsonl"):
        pid = path.stem.split("-", 1)[1]
        for line in path.open():
            event = json.loads(line)
            if event["k"] == "post" and event.get("made"):
                posts.append({**event, "pid": pid})
    return sorted(posts, key=lambda e: e["made"])


def rounds(posts: list[dict]) -> list[list[dict]]:
    out: list[list[dict]] = []
    for post in posts:
        if not out or post["made"] - out[-1][-1]["made"] > 0.3:
            out.append([])
        out[-1].append(post)
    return out


def show(posts: list[dict]) -> None:
    start = posts[0]["made"]
    print("pid      " + " ".join(f"{m:>9}" for m in MARKS))
    for p in posts:
        cells = [f"{1000 * (p[m] - start):9.1f}" if p.get(m) else f"{'-':>9}" for m in MARKS]
        print(f"{p['pid']:8} " + " ".join(cells))
    print("stage medians (ms):")
    for a, b in zip(MARKS, MARKS[1:], strict=False):
        gaps = [1000 * (p[b] - p[a]) for p in posts if p.get(a) and p.get(b)]
        if gaps:
            print(f"  {a:>9} -> {b:<9} p50 {statistics.median(gaps):6.2f}  max {max(gaps):6.2f}")
    inserted = [1000 * (p["inserted"] - start) for p in posts if p.get("inserted")]
    if inserted:
        print(f"INSERTs end from {min(inserted):.1f} to {max(inserted):.1f} ms, median {statistics.median(inserted):.1f}")
    print("POSTs per process:", dict(Counter(p["pid"] for p in posts)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--round", type=int, default=-1)
    args = parser.parse_args()
    found = rounds(load(args.folder))
    print(len(found), "rounds")
    if found:
        show(found[args.round])


if __name__ == "__main__":
    main()
