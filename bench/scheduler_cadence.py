"""How the Scheduler paces a burst: steps, admissions and wall time for N requests at once.

    python bench/scheduler_cadence.py [--tree DIR] [--requests 256] [--max-tokens 128] [--runs 3]
        [--no-hold] [--all-slots] [--engine-core]

Drives ``engine_worker.scheduler.Scheduler`` directly (no EngineCore thread, no asyncio), so the
figures are the scheduler's and mlx-lm's alone. ``--tree`` imports ``engine_worker`` from another
checkout (an old commit, for an A/B in one process); ``--no-hold`` turns the admission pacer's
hold off; ``--all-slots`` hands the generator every waiting request at once, as before 9e06d85 (a
diagnostic: it widens the scheduler's own count of free prefill slots, not the generator's);
``--engine-core`` drives the same requests through ``EngineCore``'s asyncio API instead (its
engine thread and the caller's event loop share the GIL, as in issue 2's engine_bench). One JSON
line per run: steps, steps that admitted, wall, tok/s, and the first token's
step and time (p50) from the burst's submission.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--model", default=str(Path(__file__).resolve().parents[1] / "var/models/tiny"))
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-hold", action="store_true")
    parser.add_argument("--all-slots", action="store_true")
    parser.add_argument("--engine-core", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, args.tree)
    import dataclasses

    from engine_worker.config import EngineConfig, SchedulerConfig
    from engine_worker.engine_core import EngineCore
    from engine_worker.loader import load_model
    from engine_worker.request import Request, SamplingParams
    from engine_worker.scheduler import Scheduler

    model, tokenizer = load_model(args.model)
    n = args.requests
    config = SchedulerConfig(max_num_seqs=max(256, n), prefill_batch_size=8, completion_batch_size=max(32, n),
                             enable_prefix_cache=False)
    engine = EngineCore(model, tokenizer, EngineConfig(scheduler_config=config)) if args.engine_core else None
    scheduler = engine.scheduler if engine is not None else Scheduler(model, tokenizer, config)
    pacer = getattr(scheduler, "_pacer", None)
    if args.no_hold and pacer is not None:
        pacer.hold = lambda **_: False

    def widen_slots() -> None:
        """After the warm-up, once the generator exists: it keeps the prefill_batch_size it was
        built with, and only the scheduler's own count of free slots widens."""
        if args.all_slots:
            assert scheduler.runner is not None
            scheduler.config = dataclasses.replace(config, prefill_batch_size=10**6)
    rnd = random.Random(0)
    prompts = [[rnd.randrange(10, 2900) for _ in range(rnd.randrange(16, 128))] for _ in range(n)]
    variant = {"tree": args.tree, "no_hold": args.no_hold, "all_slots": args.all_slots,
               "engine_core": args.engine_core, "requests": n}

    def run(tag: str, max_tokens: int) -> dict:
        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        t0 = time.perf_counter()
        for i, p in enumerate(prompts):
            scheduler.add_request(Request(request_id=f"{tag}-{i}", prompt=p, sampling_params=sp))
        steps = admitting = tokens = 0
        first: dict[str, tuple[int, float]] = {}
        while scheduler.has_requests():
            out = scheduler.step()
            steps += 1
            admitting += bool(out.scheduled_request_ids)
            now = time.perf_counter() - t0
            for o in out.outputs:
                if o.completion_tokens and o.request_id not in first:
                    first[o.request_id] = (steps, now)
                if o.finished:
                    tokens += o.completion_tokens
            for rid in out.finished_request_ids:
                scheduler.remove_finished_request(rid)
        wall = time.perf_counter() - t0
        return {**variant, "steps": steps, "admitting_steps": admitting, "wall_s": round(wall, 4),
                "tok_s": round(tokens / wall, 1), "first_token_step_p50": statistics.median(s for s, _ in first.values()),
                "ttft_ms_p50": round(1000 * statistics.median(t for _, t in first.values()), 2)}

    async def run_engine(tag: str, max_tokens: int) -> dict:
        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        steps0 = engine._steps_executed
        first: list[float] = []
        tokens: list[int] = []
        t0 = time.perf_counter()

        async def one(i: int, prompt: list[int]) -> None:
            rid = await engine.add_request(prompt, sp, request_id=f"{tag}-{i}")
            seen = False
            async for out in engine.stream_outputs(rid):
                if not seen and out.completion_tokens:
                    seen = True
                    first.append(time.perf_counter() - t0)
                if out.finished:
                    tokens.append(out.completion_tokens)

        await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        wall = time.perf_counter() - t0
        return {**variant, "steps": engine._steps_executed - steps0, "wall_s": round(wall, 4),
                "tok_s": round(sum(tokens) / wall, 1), "ttft_ms_p50": round(1000 * statistics.median(first), 2)}

    if engine is None:
        run("warm", 8)
        widen_slots()
        for r in range(args.runs):
            print(json.dumps(run(f"r{r}", args.max_tokens)), flush=True)
        return

    async def main_engine() -> None:
        await engine.start()
        try:
            await run_engine("warm", 8)
            widen_slots()
            for r in range(args.runs):
                print(json.dumps(await run_engine(f"r{r}", args.max_tokens)), flush=True)
        finally:
            await engine.stop()

    asyncio.run(main_engine())


if __name__ == "__main__":
    main()
