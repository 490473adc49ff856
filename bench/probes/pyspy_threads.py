"""Where each thread of a process spent its samples, from py-spy's raw output recorded with
``--threads`` (bench/h200_profile.sh): per thread, its share of the samples and, for the busy
ones, the functions that hold the most of its samples (inclusive) and the lines they sat on (self).

    python bench/probes/pyspy_threads.py ours.txt engine.txt [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import re


def load(path: str) -> dict[str, list[tuple[list[str], int]]]:
    """thread name (with its id) -> [(frames, samples)]"""
    threads: dict[str, list[tuple[list[str], int]]] = collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            thread, *frames = stack.split(";")
            threads[thread].append((frames, int(count)))
    return threads


def report(path: str, top: int) -> None:
    threads = load(path)
    total = sum(n for stacks in threads.values() for _, n in stacks)
    print(f"== {path}: {total} samples")
    for thread, stacks in sorted(threads.items(), key=lambda kv: -sum(n for _, n in kv[1])):
        samples = sum(n for _, n in stacks)
        print(f"  {samples / total:6.1%}  {thread}")
    for thread, stacks in threads.items():
        samples = sum(n for _, n in stacks)
        if samples < 0.05 * total:
            continue
        inclusive: collections.Counter[str] = collections.Counter()
        own: collections.Counter[str] = collections.Counter()
        for frames, n in stacks:
            for name in {re.sub(r":\d+\)$", ")", f) for f in frames}:
                inclusive[name] += n
            own[frames[-1] if frames else "(no frame)"] += n
        print(f"-- {thread}: {samples} samples; inclusive (less the frames of nearly every sample)")
        for name, n in [(name, n) for name, n in inclusive.most_common() if n < 0.99 * samples][:top]:
            print(f"  {n / samples:6.1%}  {name[:150]}")
        print("   self")
        for name, n in own.most_common(top // 2):
            print(f"  {n / samples:6.1%}  {name[:150]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    for path in args.files:
        report(path, args.top)


if __name__ == "__main__":
    main()
