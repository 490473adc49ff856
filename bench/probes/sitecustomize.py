"""Diagnosis probes for any Python process started with this folder first on ``PYTHONPATH``
(peer_bench's servers ``ours`` and ``engine`` inherit it): each one named in the environment wraps
methods of the service's modules, by name, as those modules are imported.

* ``STEP_PROBE=<prefix>``: :mod:`probe_step_times`, each engine step's wall time, engine-thread CPU,
  dispatch and gap;
* ``TTFT_PROBE=<prefix>``: :mod:`probe_job_marks`, each job's time at every hand-over from its claim
  to its first text at the client (bench/ttft_phases.py tabulates them);
* ``LOCK_PROBE=<prefix>``: :mod:`probe_write_lock`, who holds SQLite's write lock and how long.

With none set, nothing is imported or wrapped.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable
from typing import Any


class _Finder(importlib.abc.MetaPathFinder):
    """Finds each target module as the other finders would, and applies its patches once it is executed."""

    def __init__(self, targets: dict[str, list[Callable[[Any], None]]]) -> None:
        self._targets = targets

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        patches = self._targets.get(name)
        if not patches:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                for patch in patches:
                    patch(module)

        spec.loader = _Loader()
        return spec


# Each probe: the environment variable that turns it on, and its module (whose TARGETS maps a
# module name to the patch applied once that module is imported).
PROBES = (("STEP_PROBE", "probe_step_times"), ("TTFT_PROBE", "probe_job_marks"), ("LOCK_PROBE", "probe_write_lock"))


def _targets() -> dict[str, list[Callable[[Any], None]]]:
    found: dict[str, list[Callable[[Any], None]]] = {}
    for variable, module in PROBES:
        if os.environ.get(variable):
            for name, patch in importlib.import_module(module).TARGETS.items():
                found.setdefault(name, []).append(patch)
    return found


if targets := _targets():
    sys.meta_path.insert(0, _Finder(targets))
