"""The in-process engine with a burst that arrives spread out, against the same burst at once.

    python bench/arrival_spread.py [--spreads-ms 0,10,20] [--repeats 5] [--model PATH]

The service benchmark's baseline (``EngineCore`` in process, bench/service_bench.py) gets its 32
requests in one Python call. The service's jobs reach the engine one by one, over the 10-20 ms
in which the web tier answers a burst's POSTs (docs/benchmarks.md, fourteenth pass). This script
asks what that spread alone costs the engine. For each spread S it submits the same requests at
evenly spaced offsets over S ms, i at ``i * S / (n - 1)``, in the same order as at once. It
reports, per spread, the TTFT p50 from the round's start (what a client that sent all at once
sees) and from each request's own submission, plus tok/s over the round (first submission to
last output). Spreads alternate within every repeat; medians over the repeats, and ratios against
spread 0. Same prompts as service_bench (greedy continuations that run the full ``--max-tokens``).
Not the issue's benchmark. The last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import dump_json_line, ensure_default_model, environment, median, percentile  # noqa: E402
from service_bench import full_length_prompts  # noqa: E402

from engine_worker.config import EngineConfig  # noqa: E402
from engine_worker.engine_core import EngineCore  # noqa: E402
from engine_worker.loader import load_model  # noqa: E402
from engine_worker.request import SamplingParams  # noqa: E402


async def spread_round(engine: EngineCore, prompts: list[list[int]], max_tokens: int, spread_s: float) -> dict:
    """One burst with request i submitted ``i * spread_s / (n - 1)`` after the round's start."""
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    n = len(prompts)
    from_start: list[float] = []
    from_own: list[float] = []
    tokens: list[int] = []
    t0 = time.perf_counter()

    async def one(i: int, prompt: list[int]) -> None:
        offset = spread_s * i / max(1, n - 1)
        delay = t0 + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        submitted = time.perf_counter()
        rid = await engine.add_request(prompt, sp, request_id=f"spread-{time.time_ns()}-{i}")
        first = None
        async for out in engine.stream_outputs(rid):
            if first is None and out.completion_tokens:
                first = time.perf_counter()
            if out.finished:
                tokens.append(out.completion_tokens)
        first = first or time.perf_counter()
        from_start.append(first - t0)
        from_own.append(first - submitted)

    await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    wall = time.perf_counter() - t0
    return {"tok_s": sum(tokens) / wall, "from_start": from_start, "from_own": from_own}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--spreads-ms", default="0,10,20", help="comma-separated; the first is the baseline")
    parser.add_argument("--out", default=None, help="also append the final JSON line to this file")
    args = parser.parse_args()
    spreads = [float(s) for s in args.spreads_ms.split(",")]

    model_path = ensure_default_model(args.model).resolve()
    model, tokenizer = load_model(model_path)
    engine = EngineCore(model, tokenizer, EngineConfig.from_env())
    engine.start()
    try:
        _, prompts = full_length_prompts(engine, tokenizer, args.concurrency, args.max_tokens)
        runs: dict[float, list[dict]] = {s: [] for s in spreads}
        for _ in range(args.repeats):
            for spread in spreads:
                runs[spread].append(asyncio.run(spread_round(engine, prompts, args.max_tokens, spread / 1000)))
    finally:
        engine.stop()
        engine.close()

    def summary(rs: list[dict]) -> dict:
        return {"tok_s": round(median([r["tok_s"] for r in rs]), 1),
                "ttft_ms_p50_from_start": round(1000 * median([percentile(r["from_start"], 50) for r in rs]), 1),
                "ttft_ms_p50_from_own_submit": round(1000 * median([percentile(r["from_own"], 50) for r in rs]), 1)}

    base = summary(runs[spreads[0]])
    by_spread = {}
    for spread in spreads:
        s = summary(runs[spread])
        s["tok_s_over_baseline"] = round(s["tok_s"] / base["tok_s"], 3)
        s["added_ttft_ms_p50_from_start"] = round(s["ttft_ms_p50_from_start"] - base["ttft_ms_p50_from_start"], 1)
        by_spread[f"{spread:g}"] = s
        print(f"spread {spread:g} ms: {s}")
    dump_json_line({"bench": "arrival_spread", "concurrency": args.concurrency, "max_tokens": args.max_tokens,
                    "repeats": args.repeats, "by_spread_ms": by_spread, "env": environment()}, args.out)


if __name__ == "__main__":
    main()
