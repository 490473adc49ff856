"""Prefix-cache benchmark (issue 3), measured through the Scheduler in one run:

* **TTFT**: a ~2,000-token prompt cold (empty cache) vs the same prompt after a ~1,900-token
  prefix of it was cached (a previous request). ``hit_over_cold_ttft`` = median hit TTFT / median
  cold TTFT (goal <= 0.10). TTFT = ``add_request`` -> first output token, on the one thread that
  steps the scheduler (no engine thread, so no queueing noise).
* **Multi-turn**: a 5-turn conversation (system prompt, then user message + assistant reply per
  turn, each prompt = the whole history) with the memory-aware cache and with prefix caching off:
  total prefill tokens and wall time; ``multiturn_speedup`` = wall without / wall with.
* **Paged vs memory-aware** (and memory-aware with 8-bit KV quantization): one warm-up request,
  then 16 requests sharing a ~1,000-token system prompt submitted together: wall time, cached
  tokens, cache bytes, shared blocks.

Greedy decoding, EOS ignored. The LAST printed line is one JSON object with every figure.

    python bench/cache_bench.py [--model PATH] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import dump_json_line, ensure_default_model, environment, load_model, median  # noqa: E402

from engine_worker.cache import build_prefix_cache  # noqa: E402
from engine_worker.common.config import SchedulerConfig  # noqa: E402
from engine_worker.common.request import Request, SamplingParams  # noqa: E402
from engine_worker.sched.scheduler import Scheduler  # noqa: E402


def token_stream(tokenizer, n: int, offset: int = 0) -> list[int]:
    """``n`` tokens of the repository's corpus starting near character ``offset``."""
    from demo_model.builder import CORPUS_PATH

    text = CORPUS_PATH.read_text(encoding="utf-8")[offset : offset + 40 * n]
    out: list[int] = []
    for line in text.splitlines(keepends=True):
        out.extend(tokenizer.encode(line, add_special_tokens=False))
        if len(out) >= n:
            break
    return out[:n]


def make_scheduler(model, tokenizer, *, cache: bool = True, **fields) -> Scheduler:
    config = SchedulerConfig(enable_prefix_cache=cache, cache_memory_mb=2048, **fields)
    return Scheduler(model, tokenizer, config, prefix_cache=build_prefix_cache(model, config))


def params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def run_one(scheduler: Scheduler, rid: str, prompt: list[int], max_tokens: int) -> dict:
    """Run one request to the end; returns its TTFT, wall time, output and cached tokens."""
    start = time.perf_counter()
    scheduler.add_request(Request(rid, prompt, params(max_tokens)))
    ttft, final = None, None
    while scheduler.has_requests():
        for out in scheduler.step().outputs:
            if out.request_id != rid:
                continue
            if ttft is None and out.new_token_ids:
                ttft = time.perf_counter() - start
            if out.finished:
                final = out
    return {"ttft": ttft, "wall": time.perf_counter() - start, "tokens": final.output_token_ids,
            "cached": final.cached_tokens}


def bench_ttft(model, tokenizer, repeats: int, prompt_len: int, prefix_len: int) -> dict:
    prompt = token_stream(tokenizer, prompt_len, offset=10_000)
    cold, hit, cached = [], [], []
    run_one(make_scheduler(model, tokenizer), "warmup", prompt[:256], 1)
    for i in range(repeats):
        run = run_one(make_scheduler(model, tokenizer), f"cold{i}", prompt, 1)
        cold.append(run["ttft"])
        scheduler = make_scheduler(model, tokenizer)
        run_one(scheduler, f"prefix{i}", prompt[:prefix_len], 1)
        run = run_one(scheduler, f"hit{i}", prompt, 1)
        hit.append(run["ttft"])
        cached.append(run["cached"])
    return {"prompt_tokens": prompt_len, "cached_prefix_tokens": median(cached),
            "cold_ttft_s": median(cold), "hit_ttft_s": median(hit),
            "hit_over_cold_ttft": median(hit) / median(cold)}


def conversation(model, tokenizer, *, cache: bool, turns: int, system: list[int],
                 users: list[list[int]], reply_tokens: int) -> dict:
    scheduler = make_scheduler(model, tokenizer, cache=cache)
    history = list(system)
    prefill = 0
    start = time.perf_counter()
    for turn in range(turns):
        prompt = history + users[turn]
        run = run_one(scheduler, f"turn{turn}", prompt, reply_tokens)
        prefill += len(prompt) - run["cached"]
        history = prompt + run["tokens"]
    return {"wall_s": time.perf_counter() - start, "prefill_tokens": prefill,
            "final_prompt_tokens": len(history) - reply_tokens, "tokens": history}


def bench_multiturn(model, tokenizer, repeats: int) -> dict:
    turns, reply = 5, 32
    system = token_stream(tokenizer, 400, offset=50_000)
    users = [token_stream(tokenizer, 200, offset=80_000 + 9_000 * t) for t in range(turns)]
    walls = {True: [], False: []}
    result = {}
    for _ in range(repeats):
        for cache in (False, True):
            run = conversation(model, tokenizer, cache=cache, turns=turns, system=system,
                               users=users, reply_tokens=reply)
            walls[cache].append(run["wall_s"])
            result[cache] = run
    same = result[True]["tokens"] == result[False]["tokens"]
    return {"turns": turns, "reply_tokens": reply,
            "final_prompt_tokens": result[True]["final_prompt_tokens"],
            "prefill_tokens_with_cache": result[True]["prefill_tokens"],
            "prefill_tokens_without_cache": result[False]["prefill_tokens"],
            "wall_s_with_cache": median(walls[True]), "wall_s_without_cache": median(walls[False]),
            "multiturn_speedup": median(walls[False]) / median(walls[True]),
            "identical_conversations": same}


def bench_shared_system(model, tokenizer, n_requests: int = 16) -> dict:
    system = token_stream(tokenizer, 1000, offset=120_000)
    users = [token_stream(tokenizer, 40 + 5 * i, offset=150_000 + 3_000 * i) for i in range(n_requests)]
    report = {}
    variants = (("memory_aware", {}), ("memory_aware_kv8", {"kv_cache_quantization": True}),
                ("paged", {"use_paged_cache": True}))
    for name, fields in variants:
        scheduler = make_scheduler(model, tokenizer, **fields)
        run_one(scheduler, "warm", system + users[0][:8], 1)
        start = time.perf_counter()
        for i, user in enumerate(users):
            scheduler.add_request(Request(f"r{i}", system + user, params(16)))
        cached = 0
        while scheduler.has_requests():
            for out in scheduler.step().outputs:
                if out.finished:
                    cached += out.cached_tokens
        stats = scheduler.get_cache_stats()
        report[name] = {"wall_s": time.perf_counter() - start, "cached_tokens": cached,
                        "cache_bytes": stats["bytes_used"], "shared_blocks": stats.get("shared_blocks"),
                        "entries": stats["entries"]}
    report["paged_over_memory_aware_wall"] = report["paged"]["wall_s"] / report["memory_aware"]["wall_s"]
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="mlx-lm model folder (default: the tiny model)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--prefix-tokens", type=int, default=1900)
    args = parser.parse_args()
    path = ensure_default_model(args.model)
    model, tokenizer, _ = load_model(path)

    ttft = bench_ttft(model, tokenizer, args.repeats, args.prompt_tokens, args.prefix_tokens)
    print(f"TTFT {ttft['prompt_tokens']}-token prompt: cold {ttft['cold_ttft_s'] * 1e3:.1f} ms, "
          f"with {ttft['cached_prefix_tokens']} cached {ttft['hit_ttft_s'] * 1e3:.1f} ms "
          f"-> hit/cold {ttft['hit_over_cold_ttft']:.3f}", flush=True)
    multi = bench_multiturn(model, tokenizer, args.repeats)
    print(f"5-turn conversation: prefill {multi['prefill_tokens_without_cache']} -> "
          f"{multi['prefill_tokens_with_cache']} tokens, wall {multi['wall_s_without_cache']:.2f} s -> "
          f"{multi['wall_s_with_cache']:.2f} s (speedup {multi['multiturn_speedup']:.2f}x, "
          f"identical={multi['identical_conversations']})", flush=True)
    shared = bench_shared_system(model, tokenizer)
    for name in ("memory_aware", "memory_aware_kv8", "paged"):
        row = shared[name]
        print(f"16 requests, shared system prompt, {name}: wall {row['wall_s']:.2f} s, cached "
              f"{row['cached_tokens']} tokens, cache {row['cache_bytes'] / 2**20:.1f} MiB, "
              f"shared blocks {row['shared_blocks']}", flush=True)
    dump_json_line({
        "hit_over_cold_ttft": round(ttft["hit_over_cold_ttft"], 4),
        "multiturn_speedup": round(multi["multiturn_speedup"], 3),
        "ttft": ttft, "multiturn": multi, "shared_system_prompt": shared,
        "model": str(path), "environment": environment(),
    })


if __name__ == "__main__":
    main()
