"""Per-step timing of every EngineCore in a process, for a diagnosis: where an engine's decode step goes.

With ``bench/probes`` first on ``PYTHONPATH`` and an output prefix in ``STEP_PROBE``, every Python
process started with that environment (peer_bench's servers ``ours`` and ``engine`` both inherit
it) then times its engine thread, once ``engine_worker.engine.core`` is imported, and rewrites
``<STEP_PROBE>.<pid>.json`` every 2 s with, per step that had requests running:

* ``step_ms``: wall time of ``EngineCore._step`` (schedule, generator step, outputs);
* ``thread_cpu_ms``: the engine thread's own CPU time in it (Python, graph building, launches);
  the rest of ``step_ms`` is waiting (the device, mlx's CPU threads, the GIL, the OS scheduler);
* ``dispatch_ms``: handing the step's outputs to listeners and collectors;
* ``gap_ms``: from the end of one step's dispatch to the next step's start (the loop's own wait).

    PYTHONPATH=bench/probes STEP_PROBE=/tmp/steps python bench/peer_bench.py --servers ours,engine ...

Only the engine's own methods are wrapped, by name, at import (bench/probes/sitecustomize.py):
nothing changes for a process whose environment lacks ``STEP_PROBE``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any


class _Totals:
    def __init__(self) -> None:
        self.steps = 0
        self.step_s = self.cpu_s = self.dispatch_s = self.gap_s = 0.0
        self.gaps = 0
        self.last_end: float | None = None

    def row(self) -> dict[str, Any]:
        n = max(self.steps, 1)
        return {"pid": os.getpid(), "steps": self.steps, "step_ms": 1000 * self.step_s / n,
                "thread_cpu_ms": 1000 * self.cpu_s / n, "dispatch_ms": 1000 * self.dispatch_s / n,
                "gap_ms": 1000 * self.gap_s / max(self.gaps, 1)}


def _wrap(core: Any, prefix: str) -> None:
    totals = _Totals()
    step, dispatch = core.EngineCore._step, core.EngineCore._dispatch

    def timed_step(self: Any, commands: Any) -> Any:
        busy = bool(self.scheduler.running)
        start, cpu = time.perf_counter(), time.thread_time()
        if busy and totals.last_end is not None:
            totals.gap_s += start - totals.last_end
            totals.gaps += 1
        outputs = step(self, commands)
        end = time.perf_counter()
        if busy or outputs:
            totals.steps += 1
            totals.step_s += end - start
            totals.cpu_s += time.thread_time() - cpu
        totals.last_end = end
        return outputs

    def timed_dispatch(self: Any, outputs: Any) -> None:
        start = time.perf_counter()
        dispatch(self, outputs)
        totals.last_end = time.perf_counter()
        totals.dispatch_s += totals.last_end - start

    core.EngineCore._step, core.EngineCore._dispatch = timed_step, timed_dispatch

    def write() -> None:
        while True:
            time.sleep(2.0)
            with open(f"{prefix}.{os.getpid()}.json", "w") as out:
                json.dump(totals.row(), out)

    threading.Thread(target=write, name="step-probe", daemon=True).start()


def _wrap_core(core: Any) -> None:
    _wrap(core, os.environ["STEP_PROBE"])


TARGETS: dict[str, Callable[[Any], None]] = {"engine_worker.engine.core": _wrap_core}
