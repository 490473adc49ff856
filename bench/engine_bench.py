"""Engine benchmark (issue 2): raw mlx-lm BatchGenerator vs our EngineCore vs sequential mlx_lm.

One model, one deterministic set of prompts (varied lengths, cut from the repository's corpus),
``--max-tokens`` (128) new tokens per request, EOS ignored everywhere:

* (a) **raw**: ``mlx_lm.generate.BatchGenerator`` with no stop tokens; all prompts inserted at once,
  stepped with ``next()`` until every request finished. TTFT = insert -> first generated token.
* (b) **engine**: ``engine_worker.engine_core.EngineCore`` through its public asyncio API: all
  requests submitted concurrently (``add_request`` + ``stream_outputs``), greedy
  ``SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)``. TTFT = submit -> first output.
* (c) **seq**: ``mlx_lm.stream_generate`` one request after another (the first ``--seq-requests``
  prompts, default 8, because it is slow), with the tokenizer's EOS set emptied during the run.

For each concurrency level raw and engine runs are interleaved (raw, engine, raw, engine, ...) after
one warm-up of each; the report gives the median aggregate tok/s (all generated tokens / wall time
from the first submit to the last token, prefill included) and the TTFT p50 over all requests of
all repeats. ``engine_over_raw_cN`` is median engine tok/s / median raw tok/s at level N.

The engine hands the generator float32 logits (engine_worker/runner/float_logits.py); raw gets
the model as mlx-lm loads it. On a bfloat16 model whose log probabilities tie in bfloat16 (the
random-weight m300), raw's greedy takes the lowest id among the tied ones, so
``engine_tokens_equal_raw`` then counts fewer than all requests.

Both sides get the same batch sizes (completion_batch_size = max(32, N), prefill_batch_size 8,
prefill_step_size 2048). The engine's prefix cache is OFF by default (``--prefix-cache`` turns it
on): every repeat re-sends the same prompts, so a cache would let the engine skip prefill work that
the raw generator must do.

One-token requests (``--max-tokens 1``) as a chat service sees them: ``--chat-prefix N`` puts one
shared N-token prefix (a chat template, a system prompt) in front of every prompt and gives each
run (warm-up, each repeat) prompts of its own, so with ``--prefix-cache`` the engine's cache hits
only that prefix; ``--cache-fill M`` first sends the engine M one-token requests of other prompts
behind the same prefix, so its cache holds what a service's holds after a while (M entries).

Raw and engine share the process, its mlx allocator and the GPU, so one side's runs can shape the
other's (docs/benchmarks.md, "Engine"). ``--skip-engine`` and ``--skip-raw`` run one side
alone; alternate such processes to compare the two without that.

The LAST printed line is one JSON object with every figure.

    python bench/engine_bench.py [--model PATH] [--concurrency 1,8,32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import sys
import time
import traceback
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]  # common and engine_worker

from engine_worker.runner.mlx_core import mx  # noqa: E402

from common import (  # noqa: E402
    count_params,
    dump_json_line,
    ensure_default_model,
    environment,
    load_model,
    make_prompts,
    median,
    model_dtype,
    percentile,
)

# --------------------------------------------------------------------------------------------
# (a) raw BatchGenerator


def run_raw(model, prompts, max_tokens, completion_batch_size, prefill_batch_size, prefill_step_size):
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(
        model,
        max_tokens=max_tokens,
        stop_tokens=None,
        completion_batch_size=completion_batch_size,
        prefill_batch_size=prefill_batch_size,
        prefill_step_size=prefill_step_size,
    )
    n = len(prompts)
    c0 = time.process_time()
    t0 = time.perf_counter()
    uids = gen.insert(prompts, max_tokens=[max_tokens] * n)
    index = {uid: i for i, uid in enumerate(uids)}
    first = [None] * n
    tokens = [[] for _ in range(n)]
    done = 0
    try:
        while done < n:
            _, responses = gen.next()
            now = time.perf_counter()
            for r in responses:
                i = index[r.uid]
                if first[i] is None:
                    first[i] = now
                tokens[i].append(r.token)
                if r.finish_reason is not None:
                    done += 1
        t1 = time.perf_counter()
        c1 = time.process_time()
    finally:
        gen.close()
    total = sum(len(t) for t in tokens)
    return {
        "wall_s": t1 - t0,
        "cpu_s": c1 - c0,
        "tokens": total,
        "tok_s": total / (t1 - t0),
        "ttft_s": [f - t0 for f in first],
        "outputs": tokens,
    }


# --------------------------------------------------------------------------------------------
# (b) EngineCore


def import_engine():
    """The engine's public classes, through the seed's import path."""
    from engine_worker.common.request import SamplingParams
    from engine_worker.engine_core import EngineConfig, EngineCore, SchedulerConfig

    return EngineCore, EngineConfig, SchedulerConfig, SamplingParams


def make_engine(model, tokenizer, classes, *, concurrency, completion_batch_size, prefill_batch_size,
                prefill_step_size, prefix_cache):
    EngineCore, EngineConfig, SchedulerConfig, _ = classes
    wanted = {
        "max_num_seqs": max(256, concurrency),
        "prefill_batch_size": prefill_batch_size,
        "completion_batch_size": completion_batch_size,
        "prefill_step_size": prefill_step_size,
        "enable_prefix_cache": prefix_cache,
    }
    names = {f.name for f in dataclasses.fields(SchedulerConfig)} if dataclasses.is_dataclass(
        SchedulerConfig) else set(wanted)
    sched = SchedulerConfig(**{k: v for k, v in wanted.items() if k in names})
    return EngineCore(model, tokenizer, EngineConfig(scheduler_config=sched)), {
        k: v for k, v in wanted.items() if k in names
    }


async def run_engine(engine, classes, prompts, max_tokens, tag):
    SamplingParams = classes[3]
    n = len(prompts)
    first = [None] * n
    submit = [None] * n
    outputs = [None] * n
    counts = [0] * n
    errors = []

    async def one(i, prompt):
        rid = f"{tag}-{i}"
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        submit[i] = time.perf_counter()
        await engine.add_request(prompt, sp, request_id=rid)
        last = None
        async for out in engine.stream_outputs(rid):
            if first[i] is None and (out.new_token_ids or out.output_token_ids):
                first[i] = time.perf_counter()
            counts[i] += len(out.new_token_ids)
            last = out
            if out.finished:
                break
        if last is not None:
            outputs[i] = list(last.output_token_ids)
            if last.error:
                errors.append(f"{rid}: {last.error}")
        return time.perf_counter()

    c0 = time.process_time()
    t0 = time.perf_counter()
    ends = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    c1 = time.process_time()
    t1 = max(ends)
    total = sum(len(o) if o else c for o, c in zip(outputs, counts, strict=True))
    return {
        "wall_s": t1 - t0,
        "cpu_s": c1 - c0,
        "tokens": total,
        "tok_s": total / (t1 - t0),
        "ttft_s": [(f - s) if f is not None else None for f, s in zip(first, submit, strict=True)],
        "outputs": outputs,
        "errors": errors,
    }


# --------------------------------------------------------------------------------------------
# (c) sequential mlx_lm


def run_sequential(model, tokenizer, prompts, max_tokens):
    from mlx_lm import stream_generate

    saved = set(tokenizer.eos_token_ids)
    tokenizer.eos_token_ids = set()  # EOS ignored: every request runs to max_tokens
    ttft, total = [], 0
    try:
        t0 = time.perf_counter()
        for p in prompts:
            ts = time.perf_counter()
            n = 0
            for _resp in stream_generate(model, tokenizer, p, max_tokens=max_tokens):
                if n == 0:
                    ttft.append(time.perf_counter() - ts)
                n += 1
            total += n
        t1 = time.perf_counter()
    finally:
        tokenizer.eos_token_ids = saved
    return {"wall_s": t1 - t0, "tokens": total, "tok_s": total / (t1 - t0), "ttft_s": ttft}


# --------------------------------------------------------------------------------------------


def summarize(runs, expected_tokens):
    ttfts = [t for r in runs for t in r["ttft_s"] if t is not None]
    return {
        "tok_s_median": median([r["tok_s"] for r in runs]),
        "tok_s_runs": [round(r["tok_s"], 2) for r in runs],
        "ttft_p50_ms": round(percentile(ttfts, 50) * 1e3, 2) if ttfts else None,
        "ttft_p90_ms": round(percentile(ttfts, 90) * 1e3, 2) if ttfts else None,
        "wall_s_median": round(median([r["wall_s"] for r in runs]), 3),
        # tokens per CPU-second of the whole process (all threads): the work each side costs,
        # much less disturbed than wall time by other processes on a shared machine
        "tok_per_cpu_s_median": round(median([r["tokens"] / r["cpu_s"] for r in runs if r.get("cpu_s")]), 2),
        "tokens_per_run": runs[0]["tokens"] if runs else None,
        "gc_ms_runs": [r.get("gc_ms") for r in runs],
        "gc_full_collections": sum(r.get("gc_full", 0) for r in runs),
        "all_tokens_generated": all(r["tokens"] == expected_tokens for r in runs),
    }


class GcPauses:
    """Time the garbage collector takes during a run, on any thread (a collection holds the GIL,
    so it stalls the generator's Python either way). Full (gen-2) collections rescan the heap."""

    def __init__(self):
        self.ms = 0.0
        self.full = 0
        self._t = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase, info):
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.ms += (time.perf_counter() - self._t) * 1e3
            self.full += info["generation"] == 2

    def reset(self):
        self.ms, self.full = 0.0, 0

    def into(self, run):
        run["gc_ms"], run["gc_full"] = round(self.ms, 2), self.full
        return run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="mlx-lm model folder (default: build/ensure var/models/tiny)")
    ap.add_argument("--concurrency", default="1,8,32", help="comma-separated levels (e.g. 32,256 on the GPU)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved raw/engine pairs per level")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--warmup-tokens", type=int, default=32, help="max_tokens of the warm-up runs")
    ap.add_argument("--seq-requests", type=int, default=8, help="requests of the sequential run (0: skip)")
    ap.add_argument("--prompt-min", type=int, default=16)
    ap.add_argument("--prompt-max", type=int, default=128)
    ap.add_argument("--prefill-batch-size", type=int, default=8)
    ap.add_argument("--prefill-step-size", type=int, default=2048)
    ap.add_argument("--prefix-cache", action="store_true", help="leave the engine's prefix cache on")
    ap.add_argument("--chat-prefix", type=int, default=0,
                    help="tokens of one prefix shared by every prompt; each run then has prompts of its own")
    ap.add_argument("--cache-fill", type=int, default=0,
                    help="one-token requests sent to the engine before the runs (with --chat-prefix)")
    ap.add_argument("--skip-engine", action="store_true", help="raw and sequential only")
    ap.add_argument("--skip-raw", action="store_true",
                    help="engine only: for raw and engine in separate processes (the raw side then runs "
                         "alone with --skip-engine), so neither shapes the other's allocations")
    ap.add_argument("--no-hold", action="store_true",
                    help="diagnostic: turn the scheduler's admission pacer off (it never holds admission)")
    ap.add_argument("--out", default=None, help="also append the final JSON line to this file")
    args = ap.parse_args(argv)

    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    model_path = ensure_default_model(args.model)
    t = time.perf_counter()
    model, tokenizer, config = load_model(model_path)
    load_s = time.perf_counter() - t
    n_params = count_params(model)
    dtype = model_dtype(model)
    prompts_all = make_prompts(tokenizer, max(levels + [args.seq_requests]), args.prompt_min, args.prompt_max)
    if args.chat_prefix:
        bodies = make_prompts(tokenizer, max(levels) * (args.repeats + 1) + args.cache_fill + 1, args.prompt_min,
                              args.prompt_max)
        prefix, bodies = bodies[0][: args.chat_prefix], bodies[1:]
        prompts_all = [prefix + b for b in bodies]  # [fill..., then one set of max(levels) per run]

    result = {
        "bench": "engine_bench",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "env": environment(),
        "model": str(model_path),
        "params": n_params,
        "dtype": dtype.replace("mlx.core.", ""),
        "load_s": round(load_s, 2),
        "max_tokens": args.max_tokens,
        "prompt_len_range": [args.prompt_min, args.prompt_max],
        "repeats": args.repeats,
        "levels": {},
    }
    print(f"# model {model_path}: {n_params / 1e6:.1f}M params {result['dtype']}, "
          f"device {result['env']['device']}, blas {result['env']['blas'].get('loaded')}", flush=True)

    pauses = GcPauses()
    classes = None if args.skip_engine else import_engine()

    async def bench_level(c):
        fill = args.cache_fill if args.chat_prefix else 0
        # The prompts of each run (warm-up, then each repeat): the same ones, or with --chat-prefix
        # a set of their own behind the shared prefix.
        runs_prompts = [prompts_all[fill + k * c * bool(args.chat_prefix):][:c] for k in range(args.repeats + 1)]
        prompts = runs_prompts[0]
        cbs = max(32, c)
        pbs, pss = args.prefill_batch_size, args.prefill_step_size
        expected = c * args.max_tokens
        level = {"requests": c, "prompt_tokens": sum(len(p) for p in prompts),
                 "completion_batch_size": cbs, "prefill_batch_size": pbs}
        raw_runs, eng_runs = [], []
        engine = None
        try:
            if classes is not None:
                engine, used = make_engine(model, tokenizer, classes, concurrency=c, completion_batch_size=cbs,
                                           prefill_batch_size=pbs, prefill_step_size=pss,
                                           prefix_cache=args.prefix_cache)
                level["scheduler_config"] = used
                pacer = getattr(engine.scheduler, "_pacer", None)
                if args.no_hold and pacer is not None:
                    pacer.hold = lambda **_: False
                    level["admission_hold"] = False
                await engine.start()
            for start in range(0, fill if engine is not None else 0, c):  # the cache's entries
                await run_engine(engine, classes, prompts_all[start:min(start + c, fill)], 1, f"f{c}-{start}")
            level["cache_fill"] = fill
            # warm-up (not counted)
            if not args.skip_raw:
                run_raw(model, prompts, args.warmup_tokens, cbs, pbs, pss)
            if engine is not None:
                await run_engine(engine, classes, prompts, args.warmup_tokens, f"w{c}")
            for rep in range(args.repeats):
                gc.collect()
                pauses.reset()
                msg = f"# c={c} rep={rep}"
                if not args.skip_raw:
                    r = pauses.into(run_raw(model, runs_prompts[rep + 1], args.max_tokens, cbs, pbs, pss))
                    raw_runs.append(r)
                    msg += f" raw {r['tok_s']:.1f} tok/s"
                if engine is not None:
                    gc.collect()
                    pauses.reset()
                    e = pauses.into(await run_engine(engine, classes, runs_prompts[rep + 1], args.max_tokens,
                                                     f"c{c}r{rep}"))
                    eng_runs.append(e)
                    if raw_runs:
                        msg += (f" | engine {e['tok_s']:.1f} tok/s ({e['tok_s'] / r['tok_s']:.3f})"
                                f" | cpu s raw {r['cpu_s']:.2f} engine {e['cpu_s']:.2f}"
                                f" | gc ms raw {r['gc_ms']:.1f} engine {e['gc_ms']:.1f}")
                    else:
                        msg += f" engine {e['tok_s']:.1f} tok/s | cpu s {e['cpu_s']:.2f} | gc ms {e['gc_ms']:.1f}"
                    if e["errors"]:
                        msg += f" errors: {e['errors'][:3]}"
                print(msg, flush=True)
        finally:
            if engine is not None:
                try:
                    await engine.stop()
                finally:
                    close = getattr(engine, "close", None)
                    if close:
                        close()
        if raw_runs:
            level["raw"] = summarize(raw_runs, expected)
        if eng_runs:
            level["engine"] = summarize(eng_runs, expected)
            level["engine"]["errors"] = sum(len(e["errors"]) for e in eng_runs)
        if eng_runs and raw_runs:
            ratio = level["engine"]["tok_s_median"] / level["raw"]["tok_s_median"]
            level["engine_over_raw"] = round(ratio, 4)
            pairs = [e["tok_s"] / r["tok_s"] for r, e in zip(raw_runs, eng_runs, strict=True)]
            level["engine_over_raw_pairs"] = [round(x, 3) for x in pairs]
            level["engine_over_raw_paired_median"] = round(median(pairs), 4)
            level["engine_over_raw_cpu"] = round(
                level["engine"]["tok_per_cpu_s_median"] / level["raw"]["tok_per_cpu_s_median"], 4)
            # greedy parity between the two paths (informational: batch composition may differ)
            same = sum(1 for a, b in zip(raw_runs[-1]["outputs"], eng_runs[-1]["outputs"], strict=True) if a == b)
            level["engine_tokens_equal_raw"] = f"{same}/{c}"
        for side in ("raw", "engine"):
            if side in level:
                level[side]["tok_s_median"] = round(level[side]["tok_s_median"], 2)
        return level

    async def bench_all():
        for c in levels:
            try:
                result["levels"][str(c)] = await bench_level(c)
            except Exception as exc:
                traceback.print_exc()
                result["levels"][str(c)] = {"error": f"{type(exc).__name__}: {exc}"}
            lv = result["levels"][str(c)]
            if "engine_over_raw" in lv:
                result[f"engine_over_raw_c{c}"] = lv["engine_over_raw"]
            print(f"# level {c}: raw {lv.get('raw', {}).get('tok_s_median')} tok/s, "
                  f"engine {lv.get('engine', {}).get('tok_s_median')} tok/s, "
                  f"ratio {lv.get('engine_over_raw')} (paired {lv.get('engine_over_raw_paired_median')}, "
                  f"per CPU-second {lv.get('engine_over_raw_cpu')})", flush=True)

    asyncio.run(bench_all())

    if args.seq_requests > 0:
        seq_prompts = prompts_all[: args.seq_requests]
        run_sequential(model, tokenizer, seq_prompts[:1], min(args.warmup_tokens, args.max_tokens))
        s = run_sequential(model, tokenizer, seq_prompts, args.max_tokens)
        result["sequential"] = {
            "requests": len(seq_prompts),
            "tok_s": round(s["tok_s"], 2),
            "ttft_p50_ms": round(percentile(s["ttft_s"], 50) * 1e3, 2),
            "wall_s": round(s["wall_s"], 3),
            "tokens": s["tokens"],
        }
        print(f"# sequential {len(seq_prompts)} x {args.max_tokens}: {s['tok_s']:.1f} tok/s", flush=True)

    for key in ("engine_over_raw_c8", "engine_over_raw_c32"):
        result.setdefault(key, None)
    result["peak_memory_bytes"] = mx.get_peak_memory()
    dump_json_line(result, args.out)


if __name__ == "__main__":
    main()
