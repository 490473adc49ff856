"""Does a prefill step cost more the first time mlx sees its shape (kernel compilation per shape)?

In a service, prompts arrive staggered, so each prefill step holds a different set of prompts and
a different padded length. This times the first ``next()`` of a fresh mlx-lm ``BatchGenerator``
(one prefill step, synchronised) for 12 random batches (3-11 prompts of 40-289 tokens), then the
same 12 again, then one of them 12 times, then 12 new ones. ms per step, one line per series.

    python bench/prefill_shapes.py [--model PATH]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine_worker.loader import load_model  # noqa: E402  (loads OpenBLAS before mlx)


def first_step_ms(model, batches: list[list[int]]) -> list[float]:
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator

    out = []
    rng = random.Random(1)
    for lengths in batches:
        gen = BatchGenerator(model, completion_batch_size=32, prefill_batch_size=32, prefill_step_size=2048,
                             stream=mx.default_stream(mx.default_device()))
        prompts = [[1] + [rng.randrange(5, 2000) for _ in range(n - 1)] for n in lengths]
        gen.insert(prompts, max_tokens=[4] * len(prompts))
        started = time.perf_counter()
        gen.next()
        mx.synchronize()
        out.append(round(1000 * (time.perf_counter() - started), 2))
        gen.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="var/models/tiny")
    args = parser.parse_args()
    model, _ = load_model(args.model)
    rng = random.Random(0)

    def batches() -> list[list[int]]:
        return [[rng.randrange(40, 290) for _ in range(rng.randrange(3, 12))] for _ in range(12)]

    shapes = batches()
    print("new shapes       ", first_step_ms(model, shapes))
    print("same shapes again", first_step_ms(model, shapes))
    print("fixed shape x12  ", first_step_ms(model, [shapes[0]] * 12))
    print("new shapes 2     ", first_step_ms(model, batches()))


if __name__ == "__main__":
    main()
