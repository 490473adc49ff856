"""Structured output inside the continuous batch: a batch half constrained by a JSON schema
against the same batch all free.

``--rows`` (32) requests start together on the engine's Scheduler (no web side), each making
``--max-tokens`` (128) tokens: in the *mixed* batch half of them are constrained by a JSON schema
(an array of integers that never closes before ``max_tokens``, so every row runs the same number of
steps), the other half free; in the *free* batch all are free. Free rows ignore EOS, so both
batches generate rows x max_tokens tokens. The two batches alternate for ``--rounds`` (3) rounds
after a warm-up of each; tok/s is generated tokens over wall time, prefill included.

Prints each round, then ratios: mixed tok/s over free tok/s (the median of the rounds' ratios) and
the mask's time per step (llguidance filling one bitmask for all constrained rows, and its upload),
apart from the wait for the previous step's tokens that the matchers must consume first, and checks every constrained answer is a prefix of
JSON the schema accepts. The LAST printed line is one JSON object with these figures.

    python bench/structured_bench.py [--model PATH] [--rows 32] [--max-tokens 128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from common import dump_json_line, ensure_default_model  # noqa: E402

SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "minItems": 1000}


def _run(scheduler, prompt, rows: int, constrained: int, max_tokens: int):
    from engine_worker.common.request import Constraint, Request, SamplingParams

    constraint = Constraint("json_schema", json.dumps(SCHEMA))
    requests, constrained_ids = [], set()
    for i in range(rows):
        cons = i % 2 == 0 and i // 2 < constrained
        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=not cons,
                            constraint=constraint if cons else None)
        requests.append(Request(f"r{time.monotonic_ns()}-{i}", prompt, sp))
        if cons:
            constrained_ids.add(requests[-1].request_id)
    c = scheduler._sampling.constrained
    rows_before = (c.mask_seconds, c.mask_steps, c.sync_seconds)
    started = time.perf_counter()
    for r in requests:
        scheduler.add_request(r)
    tokens, texts = 0, {}
    while scheduler.has_requests():
        for out in scheduler.step().outputs:
            if out.finished:
                tokens += out.completion_tokens
                texts[out.request_id] = (out.output_text, out.request_id in constrained_ids)
                scheduler.remove_finished_request(out.request_id)
    elapsed = time.perf_counter() - started
    rows_obj = scheduler._sampling.constrained
    mask_s, mask_steps = rows_obj.mask_seconds - rows_before[0], rows_obj.mask_steps - rows_before[1]
    sync_s = rows_obj.sync_seconds - rows_before[2]
    return tokens / elapsed, (mask_s, sync_s), mask_steps, texts


def _valid_prefix(text: str) -> bool:
    # A constrained row stopped by max_tokens: "[n,n,...,n" with numbers in range.
    if not text.startswith("["):
        return False
    body = text[1:].rstrip(",")
    return all(part.isdigit() and int(part) <= 999 for part in body.split(",") if part)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import engine_worker.runner.mlx_core  # noqa: F401  (the fast BLAS before mlx)

    from mlx_lm import load

    from engine_worker.common.config import SchedulerConfig
    from engine_worker.sched.scheduler import Scheduler

    model_path = str(ensure_default_model(args.model))
    model, tokenizer = load(model_path)
    scheduler = Scheduler(model, tokenizer, SchedulerConfig(max_num_seqs=max(64, args.rows)))
    prompt = tokenizer.encode("def parse(data):\n    return")
    half = args.rows // 2
    _run(scheduler, prompt, args.rows, half, 8)  # warm-up, both kinds
    _run(scheduler, prompt, args.rows, 0, 8)
    ratios, mask_ms, sync_ms, free_tps, mixed_tps, valid = [], [], [], [], [], True
    for rnd in range(args.rounds):
        free, _, _, _ = _run(scheduler, prompt, args.rows, 0, args.max_tokens)
        mixed, (mask_s, sync_s), steps, texts = _run(scheduler, prompt, args.rows, half, args.max_tokens)
        valid &= all(_valid_prefix(t) for t, cons in texts.values() if cons)
        ratios.append(mixed / free)
        mask_ms.append(1000 * mask_s / max(steps, 1))
        sync_ms.append(1000 * sync_s / max(steps, 1))
        free_tps.append(free)
        mixed_tps.append(mixed)
        print(f"round {rnd}: free {free:.0f} tok/s, mixed {mixed:.0f} tok/s, ratio {mixed / free:.3f}, "
              f"mask {mask_ms[-1]:.3f} ms/step (+ {sync_ms[-1]:.3f} ms waiting for last step's tokens) over {steps} steps", flush=True)
    result = {"rows": args.rows, "constrained_rows": half, "max_tokens": args.max_tokens,
              "free_tok_s": statistics.median(free_tps), "mixed_tok_s": statistics.median(mixed_tps),
              "ratio_mixed_over_free": statistics.median(ratios),
              "mask_ms_per_step": statistics.median(mask_ms),
              "token_sync_ms_per_step": statistics.median(sync_ms), "constrained_answers_valid": valid}
    print(f"ratio mixed/free tok/s: {result['ratio_mixed_over_free']:.3f}; "
          f"mask {result['mask_ms_per_step']:.3f} ms/step; answers valid: {valid}")
    dump_json_line(result)


if __name__ == "__main__":
    main()
