"""Per-step timing of every EngineCore in a process, for a diagnosis: where an engine's decode step goes.

With ``bench/probes`` first on ``PYTHONPATH`` and an output prefix in ``STEP_PROBE``, every Python
process started with that environment (peer_bench's servers ``ours`` and ``engine`` both inherit
it) then times its engine thread, once ``engine_worker.engine.core`` is imported, and rewrites
``<STEP_PROBE>.<pid>.json`` every 2 s with, per batch size (the requests running as a step starts),
the mean over its steps of:

* ``step_ms``: wall time of ``EngineCore._step`` (schedule, generator step, outputs);
* ``thread_cpu_ms``: the engine thread's own CPU time in it (Python, graph building, launches);
  the rest of ``step_ms`` is waiting (the device, mlx's CPU threads, the GIL, the OS scheduler);
* ``dispatch_ms``: handing the step's outputs to listeners and collectors;
* ``gap_ms``: from the end of one step's dispatch to the next step's start (the loop's own wait);

and the same step times for the steps with prompt work alone (``prompt_steps``: the step admits,
or a prefill is under way, as the pacer counts them), so that the table shows admission steps and
decode-only steps apart;

and, for the whole process, why waiting requests were not admitted (``admission``: steps that
started with requests waiting, steps whose admission the pacer held, admissions that left requests
waiting with every prefill slot taken, and with slots free: the batch's cap, the token or memory
budget, a shared prefill), the garbage collector's pauses by generation (``gc``: collections and
milliseconds, any thread).

    PYTHONPATH=bench/probes STEP_PROBE=/tmp/steps python bench/peer_bench.py --servers ours,engine ...
    python bench/probes/probe_step_times.py /tmp/steps     # one table: each process, by batch size

Only the engine's own methods are wrapped, by name, at import (bench/probes/sitecustomize.py):
nothing changes for a process whose environment lacks ``STEP_PROBE``.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any


class _Totals:
    def __init__(self) -> None:
        self.steps = 0
        self.step_s = self.cpu_s = self.dispatch_s = self.gap_s = 0.0
        self.gaps = 0

    def row(self) -> dict[str, Any]:
        n = max(self.steps, 1)
        return {"steps": self.steps, "step_ms": 1000 * self.step_s / n, "thread_cpu_ms": 1000 * self.cpu_s / n,
                "dispatch_ms": 1000 * self.dispatch_s / n, "gap_ms": 1000 * self.gap_s / max(self.gaps, 1)}


# Whether the step now running hands the generator prompt work (it admits, or a prefill is under
# way): set by the scheduler's wrapped ``_run_generator``, as its pacer sees it.
PROMPT_WORK = {"now": False}


def _wrap(core: Any, prefix: str) -> None:
    by_batch: dict[int, _Totals] = {}
    prompt_steps: dict[int, _Totals] = {}  # the same, for the steps with prompt work only
    last: dict[str, Any] = {"end": None, "totals": None}  # the previous step's end, and its batch's totals
    step, dispatch = core.EngineCore._step, core.EngineCore._dispatch

    def timed_step(self: Any, commands: Any) -> Any:
        running = len(self.scheduler.running)
        start, cpu = time.perf_counter(), time.thread_time()
        totals = by_batch.setdefault(running, _Totals())
        if running and last["end"] is not None:
            totals.gap_s += start - last["end"]
            totals.gaps += 1
        PROMPT_WORK["now"] = False
        outputs = step(self, commands)
        end = time.perf_counter()
        if running or outputs:
            for t in (totals, prompt_steps.setdefault(running, _Totals())) if PROMPT_WORK["now"] else (totals,):
                t.steps += 1
                t.step_s += end - start
                t.cpu_s += time.thread_time() - cpu
        last["end"], last["totals"] = end, totals
        return outputs

    def timed_dispatch(self: Any, outputs: Any) -> None:
        start = time.perf_counter()
        dispatch(self, outputs)
        last["end"] = time.perf_counter()
        if last["totals"] is not None:
            last["totals"].dispatch_s += last["end"] - start

    core.EngineCore._step, core.EngineCore._dispatch = timed_step, timed_dispatch
    collections = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}  # generation: [count, seconds]
    began: list[float] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[:] = [time.perf_counter()]
        elif began:
            collections[info["generation"]][0] += 1
            collections[info["generation"]][1] += time.perf_counter() - began[0]

    gc.callbacks.append(on_gc)

    def write() -> None:
        while True:
            time.sleep(2.0)
            rows = {str(n): t.row() for n, t in sorted(by_batch.items()) if t.steps}
            prompt = {str(n): t.row() for n, t in sorted(prompt_steps.items()) if t.steps}
            gcs = {str(g): {"collections": c, "ms": round(1000 * t, 1)} for g, (c, t) in collections.items()}
            path = f"{prefix}.{os.getpid()}.json"
            with open(f"{path}.tmp", "w") as out:
                json.dump({"pid": os.getpid(), "argv": sys.argv[:2], "by_batch": rows, "prompt_steps": prompt,
                           "gc": gcs, "modules": len(sys.modules), "admission": ADMISSION}, out)
            os.replace(f"{path}.tmp", path)  # a reader never sees half a file

    threading.Thread(target=write, name="step-probe", daemon=True).start()


def _wrap_core(core: Any) -> None:
    _wrap(core, os.environ["STEP_PROBE"])


# Why waiting requests stay waiting, counted per process (written with the step rows).
ADMISSION = {"steps_with_waiting": 0, "pacer_held": 0, "slots_full": 0, "left_with_slots_free": 0}


def _wrap_scheduler(module: Any) -> None:
    admits, run_generator = module.Scheduler._admits_this_step, module.Scheduler._run_generator

    def flagged(self: Any) -> Any:
        PROMPT_WORK["now"] = bool(self._batch.prefilling)
        return run_generator(self)

    module.Scheduler._run_generator = flagged

    def counted(self: Any) -> bool:
        result = admits(self)
        if self.waiting:
            ADMISSION["steps_with_waiting"] += 1
            ADMISSION["pacer_held"] += not result
        return result

    module.Scheduler._admits_this_step = counted


def _wrap_admission(module: Any) -> None:
    admit = module.Admission.admit

    def counted(self: Any, insert: Any) -> Any:
        result = admit(self, insert)
        if self._waiting:
            full = self._config.prefill_batch_size - len(self._batch.prefilling) <= 0
            ADMISSION["slots_full" if full else "left_with_slots_free"] += 1
        return result

    module.Admission.admit = counted


TARGETS: dict[str, Callable[[Any], None]] = {"engine_worker.engine.core": _wrap_core,
                                             "engine_worker.sched.scheduler": _wrap_scheduler,
                                             "engine_worker.sched.admission": _wrap_admission}


def _table(prefix: str, bands: list[int]) -> None:
    """Prints each process's steps, grouped by batch size into ``bands`` (upper bounds), weighted by steps."""
    import glob

    for path in sorted(glob.glob(f"{prefix}.[0-9]*.json")):
        try:
            with open(path) as f:
                data = json.load(f)
        except ValueError:  # not whole JSON (a disk that filled up mid-write): the other files still count
            print(f"{path}: unreadable, skipped")
            continue
        if not data["by_batch"]:
            continue
        print(f"{path}  {' '.join(data.get('argv', []))}  modules {data.get('modules')}, "
              f"gc {data.get('gc')}\n  admission {data.get('admission')}")
        print("  batch      steps  step_ms  cpu_ms  dispatch_ms  gap_ms  prompt_steps  prompt_ms  decode_ms")
        low = 0
        for high in bands:
            rows = [r for n, r in data["by_batch"].items() if low < int(n) <= high]
            steps = sum(r["steps"] for r in rows)
            if steps:
                mean = {k: sum(r[k] * r["steps"] for r in rows) / steps
                        for k in ("step_ms", "thread_cpu_ms", "dispatch_ms", "gap_ms")}
                prompt = [r for n, r in data.get("prompt_steps", {}).items() if low < int(n) <= high]
                n_prompt = sum(r["steps"] for r in prompt)
                prompt_ms = sum(r["step_ms"] * r["steps"] for r in prompt)
                decode = (mean["step_ms"] * steps - prompt_ms) / (steps - n_prompt) if steps > n_prompt else 0.0
                print(f"  {low + 1:>4}-{high:<4} {steps:>7}  {mean['step_ms']:7.2f}  {mean['thread_cpu_ms']:6.2f}"
                      f"  {mean['dispatch_ms']:11.2f}  {mean['gap_ms']:6.2f}  {n_prompt:>12}"
                      f"  {prompt_ms / max(n_prompt, 1):9.2f}  {decode:9.2f}")
            low = high

if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Tabulates the probe's files by batch size.")
    parser.add_argument("prefix", help="the STEP_PROBE prefix the processes ran with")
    parser.add_argument("--bands", default="1,2,8,16,32,64,128,256", help="upper bounds of the batch-size bands")
    args = parser.parse_args()
    _table(args.prefix, [int(b) for b in args.bands.split(",")])
