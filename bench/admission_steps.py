"""What admitting new prompts costs mlx-lm's ``BatchGenerator`` step by step, and the engine's TTFT
when requests arrive in waves (as they reach a service's worker) rather than all at once.

Raw generator (no engine): 32 prompts of the service benchmark's lengths, greedy, with
``prefill_batch_size`` 8 as the engine's default. Two arrival patterns:

* **burst**: all 32 inserted before the first step;
* **waves**: 8 inserted every ``--wave-steps`` steps.

For each, the wall time of every ``next()`` (synchronised, so a step's GPU work is counted in that
step), split into steps that prefilled prompts and steps that only decoded, and the steps from a
prompt's insertion to its first generated token. Each is run with mlx-lm's ``mx.clear_cache()``
calls as shipped and with them made no-ops, to see what returning the allocator's buffers after
every prompt chunk costs.

Then the in-process ``EngineCore``: TTFT p50 (from each request's own submit) for a burst of 32
against 4 waves of 8 spaced ``--wave-ms`` apart.

    python bench/admission_steps.py [--model PATH] [--repeats 5]

The LAST printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# common first: it imports engine_worker, which loads OpenBLAS before mlx.
from common import dump_json_line, ensure_default_model, environment, load_model, make_prompts, median  # noqa: E402

from engine_worker.config import EngineConfig  # noqa: E402
from engine_worker.engine_core import EngineCore  # noqa: E402
from engine_worker.request import SamplingParams  # noqa: E402


def raw_run(model, prompts: list[list[int]], *, wave: int, wave_steps: int, max_tokens: int) -> dict:
    """Insert ``wave`` prompts every ``wave_steps`` steps (all at once when ``wave`` covers
    them); step until every prompt has its first token. Per-step times and steps-to-first-token."""
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(model, completion_batch_size=32, prefill_batch_size=8, prefill_step_size=2048,
                         stream=mx.default_stream(mx.default_device()))
    pending = list(prompts)
    inserted_at: dict[int, int] = {}
    first_at: dict[int, int] = {}
    prefill_ms: list[float] = []
    decode_ms: list[float] = []
    step = 0
    while len(first_at) < len(prompts):
        if pending and step % wave_steps == 0:
            batch, pending = pending[:wave], pending[wave:]
            for uid in gen.insert(batch, max_tokens=[max_tokens] * len(batch)):
                inserted_at[uid] = step
        t0 = time.perf_counter()
        prompt_responses, generated = gen.next()
        mx.synchronize()
        ms = 1000 * (time.perf_counter() - t0)
        (prefill_ms if any(not r.end_of_prompt for r in prompt_responses) else decode_ms).append(ms)
        for r in generated:
            first_at.setdefault(r.uid, step)
        step += 1
    gen.close()
    waits = [first_at[u] - inserted_at[u] + 1 for u in inserted_at]
    return {"steps": step, "prefill_step_ms": prefill_ms, "decode_step_ms": decode_ms,
            "steps_to_first_token_p50": median(waits), "wall_ms": sum(prefill_ms) + sum(decode_ms)}


def raw_summary(runs: list[dict]) -> dict:
    return {
        "prefill_step_ms_p50": round(median([m for r in runs for m in r["prefill_step_ms"]]), 2),
        "decode_step_ms_p50": round(median([m for r in runs for m in r["decode_step_ms"]] or [0.0]), 2),
        "prefill_steps": len(runs[0]["prefill_step_ms"]),
        "steps_to_first_token_p50": median([r["steps_to_first_token_p50"] for r in runs]),
        "wall_ms_p50": round(median([r["wall_ms"] for r in runs]), 2),
    }


async def engine_ttft(engine: EngineCore, prompts: list[list[int]], *, wave: int, wave_ms: float,
                      max_tokens: int) -> list[float]:
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    ttft: list[float] = []

    async def one(i: int, prompt: list[int]) -> None:
        await asyncio.sleep((i // wave) * wave_ms / 1000)
        t0 = time.perf_counter()
        rid = await engine.add_request(prompt, sp, request_id=f"adm-{time.time_ns()}-{i}")
        first = None
        async for out in engine.stream_outputs(rid):  # to the end: an abort costs the engine work too
            if first is None and out.completion_tokens:
                first = 1000 * (time.perf_counter() - t0)
        ttft.append(first or 0.0)

    await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return ttft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--wave-steps", type=int, default=3)
    parser.add_argument("--wave-ms", type=float, default=8.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model, tokenizer, _ = load_model(ensure_default_model(args.model))
    prompts = make_prompts(tokenizer, 32, lo=24, hi=100)

    import mlx.core as mx

    real_clear = mx.clear_cache
    result: dict = {"bench": "admission_steps", "raw": {}, "engine": {}}
    for clear in ("as_shipped", "no_clear_cache"):
        mx.clear_cache = real_clear if clear == "as_shipped" else (lambda: None)
        for name, wave in (("burst", 32), ("waves", 8)):
            raw_run(model, prompts, wave=wave, wave_steps=args.wave_steps, max_tokens=16)  # warm-up
            runs = [raw_run(model, prompts, wave=wave, wave_steps=args.wave_steps, max_tokens=16)
                    for _ in range(args.repeats)]
            result["raw"][f"{name}_{clear}"] = raw_summary(runs)
            print(name, clear, result["raw"][f"{name}_{clear}"], flush=True)
    mx.clear_cache = real_clear

    engine = EngineCore(model, tokenizer, EngineConfig.from_env())
    engine.start()
    try:
        for name, wave in (("burst", 32), ("waves", 8)):
            asyncio.run(engine_ttft(engine, prompts, wave=wave, wave_ms=args.wave_ms, max_tokens=8))
            ttft = [t for _ in range(args.repeats)
                    for t in asyncio.run(engine_ttft(engine, prompts, wave=wave, wave_ms=args.wave_ms, max_tokens=8))]
            result["engine"][f"{name}_ttft_ms_p50"] = round(median(ttft), 2)
            print(name, "engine ttft p50", result["engine"][f"{name}_ttft_ms_p50"], flush=True)
    finally:
        engine.stop()
        engine.close()
    result["env"] = environment()
    dump_json_line(result, args.out)


if __name__ == "__main__":
    main()
