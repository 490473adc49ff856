"""vllm-mlx's memory hygiene, in our engine, for an A/B of peak device memory without changing the
engine: with ``bench/probes`` first on ``PYTHONPATH`` and ``CLEAR_CACHE_EVERY=N``, every
``EngineCore`` of the process calls ``mx.clear_cache()`` on its engine thread after a step in which
a request finished, and after every N-th step with requests running (vllm-mlx's scheduler does
both: seed S33, S46), so mlx's allocator hands its freed buffers back to the device.

    PYTHONPATH=bench/probes CLEAR_CACHE_EVERY=32 python bench/peer_bench.py --servers engine ...
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def _wrap_core(core: Any) -> None:
    import mlx.core as mx

    every = int(os.environ["CLEAR_CACHE_EVERY"])
    step = core.EngineCore._step
    count = [0]

    def step_then_clear(self: Any, commands: Any) -> Any:
        outputs = step(self, commands)
        if self.scheduler.running:
            count[0] += 1
        if any(out.finished for out in outputs) or (count[0] and count[0] % every == 0):
            mx.clear_cache()
        return outputs

    core.EngineCore._step = step_then_clear


TARGETS: dict[str, Callable[[Any], None]] = {"engine_worker.engine.core": _wrap_core}
