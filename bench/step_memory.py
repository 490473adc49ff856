"""The working memory of one generator step, measured, against what the budget reserves for it.

mlx's allocator keeps up to ``MemoryBudget.allocator_cache`` bytes of freed buffers for reuse
(engine_worker/sched/memory.py). What the next step can reuse is what one step allocates and frees:
its working memory. This loads a model, fills a ``BatchGenerator`` with ``--rows`` prompts of
``--prompt-tokens`` tokens (prefill batch 8, step 2048, as the engine runs it) and reads
``mx.get_peak_memory()`` around single steps (after ``mx.reset_peak_memory()``): the largest
prefill step and a decode step of the full batch. ``step_bytes`` is the peak above the memory
active before the step. Printed beside them: the budget's estimate of the same steps
(``MemoryBudget.working_bytes``) and its allocator cache.

    python bench/step_memory.py [--model PATH] [--rows 128] [--prompt-tokens 128]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

from engine_worker.runner.mlx_core import mx  # noqa: E402

from common import dump_json_line, ensure_default_model  # noqa: E402

from engine_worker.common.config import SchedulerConfig  # noqa: E402
from engine_worker.runner.loader import load_model  # noqa: E402
from engine_worker.sched.memory import BatchShape, MemoryBudget, round_up  # noqa: E402

MIB = 1 << 20


def measure(model, rows: int, prompt_tokens: int, decode_steps: int = 4) -> dict:
    from mlx_lm.generate import BatchGenerator

    prompts = [[(7 * i + j) % 200 + 10 for j in range(prompt_tokens)] for i in range(rows)]
    # No row may finish before every row decodes: the rows prefill 8 at a time, between decode steps.
    gen = BatchGenerator(model, max_tokens=10_000, stop_tokens=None, completion_batch_size=rows,
                         prefill_batch_size=8, prefill_step_size=2048)
    gen.insert(prompts, max_tokens=[10_000] * rows)
    prefill = decode = 0
    try:
        steps = 0
        while True:
            mx.synchronize()
            active = mx.get_active_memory()
            mx.reset_peak_memory()
            _, responses = gen.next()
            mx.synchronize()
            used = mx.get_peak_memory() - active
            if len(responses) < rows:  # a step that prefilled (the rows still waiting did not decode)
                prefill = max(prefill, used)
            else:
                decode = max(decode, used)
                steps += 1
                if steps >= decode_steps:
                    break
    finally:
        gen.close()
    return {"prefill_step_bytes": int(prefill), "decode_step_bytes": int(decode)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    args = parser.parse_args()
    path = ensure_default_model(args.model)
    model, _ = load_model(path)
    mx.set_cache_limit(0)  # every freed buffer goes back: the peak is the step's own
    found = measure(model, args.rows, args.prompt_tokens)
    config = SchedulerConfig(completion_batch_size=args.rows)
    budget = MemoryBudget.for_model(model, config, 0.9)
    kv = round_up(args.prompt_tokens + 8)
    estimate = {
        "decode_estimate_bytes": budget.working_bytes(BatchShape(rows=args.rows, kv_tokens=kv)),
        "prefill_estimate_bytes": budget.working_bytes(BatchShape(
            rows=8, kv_tokens=kv, prefill_rows=8, prefill_tokens=args.prompt_tokens,
            prefill_context=args.prompt_tokens)),
    }
    result = {"bench": "step_memory", "model": str(path), "rows": args.rows, "prompt_tokens": args.prompt_tokens,
              **found, **estimate, "allocator_cache_bytes": budget.allocator_cache, "budget_bytes": budget.total}
    for key, value in result.items():
        if key.endswith("_bytes"):
            print(f"  {key:<26} {value / MIB:10.1f} MiB")
    dump_json_line(result)


if __name__ == "__main__":
    main()
