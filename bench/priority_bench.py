"""Interactive TTFT in the engine alone, idle and while low-priority requests keep it full.

The in-process counterpart of bench/batch_bench.py's ``interactive_ttft_ratio``: one
``EngineCore`` (``ENGINE_*`` settings from the environment; the service's defaults are
``ENGINE_POLICY=priority`` and a completion batch of 32), no web tier, queue or database. One
client sends greedy ``--interactive-tokens`` requests at priority 10, one after another: TTFT p50
while nothing else runs, then while ``--in-flight`` clients each keep one ``--batch-tokens``
request at priority 100 (a batch's jobs) running. ``engine_interactive_ttft_ratio`` = busy / idle.
The batch's share of that ratio in the service is this figure; the rest is the service's. What the
interactive client costs the batch: ``batch_rate_with_interactive``, the batch's tokens/s while the
client runs over its tokens/s alone.

    python bench/priority_bench.py [--model PATH] [--in-flight 40] [--batch-tokens 64]

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

from common import dump_json_line, ensure_default_model, environment, load_model, percentile  # noqa: E402

from engine_worker.common.config import EngineConfig  # noqa: E402
from engine_worker.common.request import SamplingParams  # noqa: E402
from engine_worker.engine.core import EngineCore  # noqa: E402

INTERACTIVE_PRIORITY, BATCH_PRIORITY = 10, 100


async def ttft(engine: EngineCore, prompt: list[int], max_tokens: int, priority: int,
               tokens: list[int] | None = None) -> float:
    """Seconds from submit to the first token of one greedy request (read to its end); its tokens
    are counted in ``tokens[0]`` as they come."""
    rid = await engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0), priority=priority)
    t0, first = time.perf_counter(), None
    async for out in engine.stream_outputs(rid):
        if first is None and out.new_token_ids:
            first = time.perf_counter() - t0
        if tokens is not None:
            tokens[0] += len(out.new_token_ids)
        if out.finished:
            break
    return first if first is not None else float("nan")


async def measure(engine: EngineCore, tokenizer, args) -> dict[str, float]:
    """TTFT p50 idle and busy, and the batch's tokens/s alone and while the interactive client runs."""
    interactive = tokenizer.encode("The quick brown fox")
    idle = [await ttft(engine, interactive, args.interactive_tokens, INTERACTIVE_PRIORITY)
            for _ in range(args.requests)]
    stop = asyncio.Event()
    batch_tokens = [0]

    async def batch_client(c: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            prompt = tokenizer.encode(f"Story number {c}-{n}: once upon a time")
            await ttft(engine, prompt, args.batch_tokens, BATCH_PRIORITY, batch_tokens)

    async def batch_rate(work) -> tuple[float, object]:
        """The batch's tokens/s while ``work`` runs, and what it returned."""
        t0, n0 = time.perf_counter(), batch_tokens[0]
        result = await work
        return (batch_tokens[0] - n0) / (time.perf_counter() - t0), result

    clients = asyncio.gather(*(batch_client(c) for c in range(args.in_flight)))
    await asyncio.sleep(2.0)  # the batch fills the engine
    alone_rate, _ = await batch_rate(asyncio.sleep(args.batch_alone_s))

    async def interactive_client() -> list[float]:
        return [await ttft(engine, interactive, args.interactive_tokens, INTERACTIVE_PRIORITY)
                for _ in range(args.requests)]

    busy_rate, busy = await batch_rate(interactive_client())
    stop.set()
    await clients
    idle_p50, busy_p50 = percentile(idle, 50), percentile(busy, 50)
    return {"ttft_ms_p50_idle": round(1000 * idle_p50, 1), "ttft_ms_p50_busy": round(1000 * busy_p50, 1),
            "engine_interactive_ttft_ratio": round(busy_p50 / idle_p50, 2),
            "batch_tok_s_alone": round(alone_rate, 1), "batch_tok_s_with_interactive": round(busy_rate, 1),
            "batch_rate_with_interactive": round(busy_rate / alone_rate, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--in-flight", type=int, default=40, help="batch requests kept running (the service's cap)")
    parser.add_argument("--batch-tokens", type=int, default=64)
    parser.add_argument("--interactive-tokens", type=int, default=16)
    parser.add_argument("--requests", type=int, default=30, help="interactive requests per phase")
    parser.add_argument("--batch-alone-s", type=float, default=5.0, help="seconds the batch's rate is measured alone")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    model_path = ensure_default_model(args.model)
    model, tokenizer, _config = load_model(model_path)
    config = EngineConfig.from_env()
    engine = EngineCore(model, tokenizer, config)
    engine.start()
    try:
        figures = asyncio.run(measure(engine, tokenizer, args))
    finally:
        engine.close()
    dump_json_line({
        "bench": "priority", "model": str(model_path), "in_flight": args.in_flight,
        "batch_tokens": args.batch_tokens, "interactive_tokens": args.interactive_tokens,
        "policy": config.scheduler_config.policy.value,
        "completion_batch_size": config.scheduler_config.completion_batch_size,
        **figures, "env": environment(),
    }, args.out)


if __name__ == "__main__":
    main()
