"""Memory benchmark (issue 33): the engine's peak device memory against raw mlx-lm BatchGenerator's
at the same load, with throughput in the same run.

Load: ``--requests`` (128) prompts of 16-128 tokens cut from the repository's corpus,
``--max-tokens`` (128) new tokens each, EOS ignored, greedy, completion batch ``--completion-batch``
(128), prefill batch 8, prefill step 2048, all submitted at once. Three runs per repeat,
interleaved (raw, engine, budget, raw, engine, budget, ...) after a warm-up of each (the same
prompts, 16 tokens):

* **raw**: ``mlx_lm.generate.BatchGenerator`` stepped with ``next()`` until all finish, under mlx's
  own allocator settings (restored before each raw run);
* **engine**: ``EngineCore`` with the prefix cache off (raw has none) and its default budget;
* **budget**: ``EngineCore`` with the prefix cache on and a budget of ``--budget-over-raw`` (1.5)
  times raw's first peak, the same prompts twice (the second time they hit the cache). It must
  never exceed the budget.
* **service**: ``EngineCore`` as the service runs it: every setting at its default (prefix cache on,
  default budget), sampled at temperature 0.8 so every reply differs, the same prompts twice.
  Its ``prefix_cache`` part and ``cache_entries`` show what the prefix cache keeps of a load whose
  replies nobody asks for again.

Each run starts from an empty allocator cache and a reset peak. Figures per run, in MiB:
``peak_active`` is mlx's peak of live arrays (``mx.get_peak_memory()``, the memory the run needed
at its busiest, transients inside a step included); ``peak_footprint`` adds the allocator's cache
(what the device sees): the largest ``active + cache`` seen between steps, and at least
``peak_active`` plus the largest cache seen. ``parts`` are the largest weights, KV (the generator's
KV buffers), prefix cache and allocator cache seen between steps.

The LAST printed line is one JSON object: ``peak_over_raw`` (median engine peak_active over median
raw peak_active; goal <= 1.3), ``footprint_over_raw`` (the same for peak_footprint; raw keeps mlx's
default cache limit, 95 % of the memory limit on CUDA, 32 MiB on the CPU), ``tok_s_over_raw``
(median engine tok/s over median raw tok/s), and ``within_budget`` (every budget run's footprint
at or below its budget).

    python bench/memory_bench.py [--model PATH] [--requests 128] [--max-tokens 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]  # common and engine_worker

from engine_worker.runner.mlx_core import mx  # noqa: E402

from common import dump_json_line, ensure_default_model, environment, make_prompts, median  # noqa: E402

from engine_worker.common.config import EngineConfig, SchedulerConfig  # noqa: E402
from engine_worker.common.request import SamplingParams  # noqa: E402
from engine_worker.engine_core import EngineCore  # noqa: E402
from engine_worker.runner.device_memory import device_memory_bytes, weights_bytes  # noqa: E402
from engine_worker.runner.loader import load_model  # noqa: E402

MIB = 1 << 20
PREFILL_BATCH = 8
PREFILL_STEP = 2048


class Sampler:
    """Memory figures between steps: the allocator's, and the parts the caller reads."""

    def __init__(self, weights: int) -> None:
        self.weights = weights
        self.footprint = self.cache = self.kv = self.prefix = 0

    def sample(self, kv: int = 0, prefix: int = 0) -> None:
        active, cache = mx.get_active_memory(), mx.get_cache_memory()
        self.footprint = max(self.footprint, active + cache)
        self.cache = max(self.cache, cache)
        self.kv = max(self.kv, kv)
        self.prefix = max(self.prefix, prefix)

    def report(self, tokens: int, wall: float) -> dict:
        peak = mx.get_peak_memory()
        return {"tok_s": round(tokens / wall, 1), "tokens": tokens, "wall_s": round(wall, 3),
                "peak_active_mib": round(peak / MIB, 1),
                "peak_footprint_mib": round(max(self.footprint, peak + self.cache) / MIB, 1),
                "parts_mib": {"weights": round(self.weights / MIB, 1), "kv": round(self.kv / MIB, 1),
                              "prefix_cache": round(self.prefix / MIB, 1),
                              "allocator_cache": round(self.cache / MIB, 1)}}


def fresh_allocator(limits: tuple[int, int] | None = None) -> None:
    """Empty the allocator's cache and reset its peak; with ``limits``, restore them."""
    gc.collect()
    mx.synchronize()
    if limits is not None:
        mx.set_memory_limit(limits[0])
        mx.set_cache_limit(limits[1])
    mx.clear_cache()
    mx.reset_peak_memory()


def run_raw(model, prompts: list[list[int]], max_tokens: int, completion_batch: int, weights: int) -> dict:
    from mlx_lm.generate import BatchGenerator

    sampler = Sampler(weights)
    gen = BatchGenerator(model, max_tokens=max_tokens, stop_tokens=None, completion_batch_size=completion_batch,
                         prefill_batch_size=PREFILL_BATCH, prefill_step_size=PREFILL_STEP)
    t0 = time.perf_counter()
    gen.insert(prompts, max_tokens=[max_tokens] * len(prompts))
    done = tokens = 0
    try:
        while done < len(prompts):
            _, responses = gen.next()
            tokens += len(responses)
            done += sum(1 for r in responses if r.finish_reason is not None)
            sampler.sample(kv=gen.prompt_cache_nbytes)
        wall = time.perf_counter() - t0
    finally:
        gen.close()
    return sampler.report(tokens, wall)


def run_engine(model, tokenizer, prompts: list[list[int]], max_tokens: int, completion_batch: int, weights: int,
               *, prefix_cache: bool, fraction: float | None = None, rounds: int = 1,
               temperature: float = 0.0) -> dict:
    sched = SchedulerConfig(completion_batch_size=completion_batch, prefill_batch_size=PREFILL_BATCH,
                            prefill_step_size=PREFILL_STEP, enable_prefix_cache=prefix_cache)
    config = EngineConfig(scheduler_config=sched) if fraction is None else \
        EngineConfig(scheduler_config=sched, gpu_memory_utilization=fraction)
    engine = EngineCore(model, tokenizer, config)
    sampler = Sampler(weights)
    scheduler = engine.scheduler

    def listener(_outputs) -> None:  # on the engine thread, between steps
        runner = scheduler.runner
        sampler.sample(kv=runner.kv_bytes() if runner is not None else 0, prefix=getattr(scheduler.prefix_cache, "bytes_used", 0))

    engine.add_output_listener(listener)
    sp = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True)
    counts: list[int] = []

    async def one(tag: str, prompt: list[int]) -> None:
        rid = await engine.add_request(prompt, sp, request_id=tag)
        async for out in engine.stream_outputs(rid):
            if out.finished:
                counts.append(out.completion_tokens)
                if out.error:
                    raise RuntimeError(f"{tag}: {out.error}")

    async def round_(r: int) -> None:
        await asyncio.gather(*(one(f"r{r}-{i}", p) for i, p in enumerate(prompts)))

    try:
        engine.start()
        t0 = time.perf_counter()
        for r in range(rounds):
            asyncio.run(round_(r))
        wall = time.perf_counter() - t0
        stats = engine.get_stats()
        cache_stats = scheduler.get_cache_stats() or {}
    finally:
        engine.close()
    result = sampler.report(sum(counts), wall)
    result["budget_mib"] = round(engine.memory_budget.total / MIB, 1)
    result["preemptions"] = stats["counters"]["num_preemptions"]
    result["allocation_failures"] = stats["counters"]["num_allocation_failures"]
    result["allocator_cache_limit_mib"] = round(stats["memory"]["cache_limit_bytes"] / MIB, 1)
    result["cache_entries"] = cache_stats.get("entries")
    result["cache_hits"] = cache_stats.get("hits")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--completion-batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget-over-raw", type=float, default=1.5,
                        help="the budget run's budget, as a multiple of raw's peak_active in the first repeat")
    parser.add_argument("--out", default=None, help="also append the final JSON line to this file")
    args = parser.parse_args()

    model_path = ensure_default_model(args.model)
    model, tokenizer = load_model(model_path)
    weights = weights_bytes(model)
    prompts = make_prompts(tokenizer, args.requests)
    mlx_limits = (mx.get_memory_limit(), mx.set_cache_limit(0))
    mx.set_cache_limit(mlx_limits[1])
    device_bytes, device_source = device_memory_bytes()
    # Warm-up at the full batch (mlx compiles kernels per shape on first use), 16 tokens each.
    warm = (prompts, 16, args.completion_batch, weights)
    run_raw(model, *warm)
    run_engine(model, tokenizer, *warm, prefix_cache=True)

    runs: dict[str, list[dict]] = {"raw": [], "engine": [], "budget": [], "service": []}
    budget_bytes = None
    for repeat in range(args.repeats):
        fresh_allocator(mlx_limits)
        runs["raw"].append(run_raw(model, prompts, args.max_tokens, args.completion_batch, weights))
        fresh_allocator()
        runs["engine"].append(run_engine(model, tokenizer, prompts, args.max_tokens, args.completion_batch, weights,
                                         prefix_cache=False))
        if budget_bytes is None:
            budget_bytes = int(args.budget_over_raw * runs["raw"][0]["peak_active_mib"] * MIB)
        fresh_allocator()
        runs["budget"].append(run_engine(model, tokenizer, prompts, args.max_tokens, args.completion_batch, weights,
                                         prefix_cache=True, fraction=budget_bytes / device_bytes, rounds=2))
        fresh_allocator()
        runs["service"].append(run_engine(model, tokenizer, prompts, args.max_tokens, args.completion_batch, weights,
                                          prefix_cache=True, rounds=2, temperature=0.8))
        print(f"repeat {repeat}: " + ", ".join(
            f"{name} {r[-1]['tok_s']:.0f} tok/s peak {r[-1]['peak_active_mib']:.0f}/{r[-1]['peak_footprint_mib']:.0f} MiB"
            for name, r in runs.items()), flush=True)
    fresh_allocator(mlx_limits)
    dump_json_line(_report(runs, args, model_path, device_bytes, device_source), args.out)


def _report(runs: dict[str, list[dict]], args, model_path: Path, device_bytes: int, device_source: str) -> dict:
    def med(name: str, key: str) -> float:
        return median([r[key] for r in runs[name]])

    def summary(name: str) -> dict:
        keys = ("tok_s", "peak_active_mib", "peak_footprint_mib")
        return {**{k: med(name, k) for k in keys}, "runs": runs[name]}

    budget_ok = all(r["peak_footprint_mib"] <= r["budget_mib"] for r in runs["budget"])
    return {
        "bench": "memory",
        "model": str(model_path),
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "completion_batch": args.completion_batch,
        "repeats": args.repeats,
        "device_memory_mib": round(device_bytes / MIB), "device_memory_source": device_source,
        "raw": summary("raw"),
        "engine": summary("engine"),
        "budget": summary("budget"),
        "service": summary("service"),
        "env": environment(),
        "peak_over_raw": round(med("engine", "peak_active_mib") / med("raw", "peak_active_mib"), 3),
        "footprint_over_raw": round(med("engine", "peak_footprint_mib") / med("raw", "peak_footprint_mib"), 3),
        "tok_s_over_raw": round(med("engine", "tok_s") / med("raw", "tok_s"), 3),
        "service_footprint_over_raw": round(med("service", "peak_footprint_mib")
                                            / med("raw", "peak_footprint_mib"), 3),
        "within_budget": budget_ok,
    }


if __name__ == "__main__":
    main()
