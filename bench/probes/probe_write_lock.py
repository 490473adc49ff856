"""Who holds SQLite's write lock, and for how long: a diagnosis of the submissions' wait for it.

With ``bench/probes`` first on ``PYTHONPATH`` and an output prefix in ``LOCK_PROBE``, every process
of the service times each outermost hold of the write lock of ``inference_service.sqlite_backend``
(the wait to get it, and the hold until its release) and names the writer by the first function of
the service's own code on the stack that is one of ``WRITERS`` (else ``other``). It rewrites
``<LOCK_PROBE>.<pid>.json`` every 2 s with, per writer: holds, and the p50 / p90 / total of the
waits and of the holds, in ms.

    PYTHONPATH=bench/probes LOCK_PROBE=/tmp/lock python bench/peer_bench.py --servers ours ...
    python bench/probes/probe_write_lock.py /tmp/lock     # one table over every process

Nothing changes for a process whose environment lacks ``LOCK_PROBE``.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

# The service's writers, by the function that writes (the first of these on the stack names it).
WRITERS = ("job_create", "jobs_claim", "job_claim", "jobs_store_finals", "jobs_record_progress", "job_fail",
           "job_hand_back", "job_mark_dispatched", "job_renew_leases", "jobs_reconcile", "jobs_expire_queued",
           "job_dispatch_counted", "usage_rollup")

_samples: dict[str, dict[str, list[float]]] = {}
_held = threading.local()
_mutex = threading.Lock()


def _writer() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name in WRITERS:
            return frame.f_code.co_name
        frame = frame.f_back
    return "other"


def _patch(module: Any) -> None:
    lock_cls = module.WriteLock
    acquire: Callable[..., Any] = lock_cls.acquire
    release: Callable[..., Any] = lock_cls.release

    def timed_acquire(self: Any, timeout_s: float) -> None:
        outermost = getattr(_held, "start", None) is None
        start = time.perf_counter()
        acquire(self, timeout_s)
        if outermost:
            _held.start, _held.wait, _held.writer = time.perf_counter(), time.perf_counter() - start, _writer()

    def timed_release(self: Any) -> None:
        release(self)
        if getattr(_held, "start", None) is not None and self._depth == 0:
            hold = time.perf_counter() - _held.start
            with _mutex:
                entry = _samples.setdefault(_held.writer, {"wait": [], "hold": []})
                entry["wait"].append(_held.wait * 1000)
                entry["hold"].append(hold * 1000)
            _held.start = None

    lock_cls.acquire, lock_cls.release = timed_acquire, timed_release
    threading.Thread(target=_dump, name="lock-probe", daemon=True).start()


def _dump() -> None:
    path = f"{os.environ['LOCK_PROBE']}.{os.getpid()}.json"
    while True:
        time.sleep(2)
        with _mutex:
            data = {writer: {kind: list(values) for kind, values in entry.items()} for writer, entry in _samples.items()}
        with open(path + ".tmp", "w") as f:
            json.dump(data, f)
        os.replace(path + ".tmp", path)


TARGETS: dict[str, Callable[[Any], None]] = {"inference_service.sqlite_backend.write_lock": _patch}


def _q(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def main() -> None:
    merged: dict[str, dict[str, list[float]]] = {}
    for path in glob.glob(f"{sys.argv[1]}.[0-9]*.json"):
        with open(path) as f:
            for writer, entry in json.load(f).items():
                for kind, values in entry.items():
                    merged.setdefault(writer, {"wait": [], "hold": []})[kind].extend(values)
    print(f"{'writer':>20} {'holds':>6} {'wait p50':>9} {'p90':>7} {'hold p50':>9} {'p90':>7} {'hold total':>11}")
    for writer, entry in sorted(merged.items(), key=lambda item: -sum(item[1]["hold"])):
        wait, hold = entry["wait"], entry["hold"]
        print(f"{writer:>20} {len(hold):>6} {_q(wait, .5):>8.1f}  {_q(wait, .9):>6.1f} {_q(hold, .5):>8.1f}  "
              f"{_q(hold, .9):>6.1f} {sum(hold):>9.0f} ms")


if __name__ == "__main__":
    main()
