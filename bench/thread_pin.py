"""Pin the two engine threads of bench/service_bench.py to one core (Linux; diagnostics).

On the GPU host the same decode step cost its thread 1.5-1.6 ms of CPU in one round and 2.2-2.6
ms in the next, in either process (docs/benchmarks.md, twelfth pass), so a ratio of one side's
rounds to the other's carried two independent draws of the host's speed. With
``--pin-engine-cpu N`` the in-process engine's thread and the worker's engine thread both run on
core N (they never run at once: the rounds alternate), so both sides draw from the same core.
Only those two threads are pinned; the rest of each process, and the web tier, run where the
kernel puts them.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from common import proc_cpu_ticks


def own_engine_thread() -> int:
    """The native id of this process's engine thread (``EngineCore`` names it ``engine-...``)."""
    ids = [t.native_id for t in threading.enumerate() if t.name.startswith("engine-") and t.native_id]
    if len(ids) != 1:
        raise RuntimeError(f"expected one engine thread in this process, found {len(ids)}")
    return ids[0]


def thread_ticks(pid: int, tid: int) -> int:
    """CPU ticks (user + system) thread ``tid`` of process ``pid`` has used so far."""
    return proc_cpu_ticks(f"/proc/{pid}/task/{tid}/stat")


def busiest_thread(pid: int) -> int:
    """The thread of process ``pid`` (not its main thread) that has used the most CPU so far.
    In an engine worker after a round of jobs, that is its engine thread."""
    best, best_ticks = None, -1
    for task in Path(f"/proc/{pid}/task").iterdir():
        tid = int(task.name)
        if tid == pid:
            continue
        try:
            ticks = thread_ticks(pid, tid)
        except OSError:  # the thread ended meanwhile
            continue
        if ticks > best_ticks:
            best, best_ticks = tid, ticks
    if best is None:
        raise RuntimeError(f"process {pid} has no threads besides its main one")
    return best


def pin(tid: int, cpu: int) -> list[int]:
    """Pin thread ``tid`` to core ``cpu``; returns its affinity as the kernel reports it after."""
    os.sched_setaffinity(tid, {cpu})
    return sorted(os.sched_getaffinity(tid))
