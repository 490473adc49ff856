"""CPU time of a server's process tree by role (web, worker, engine), and of each process's busiest
threads: where a level's CPU went, read from ``/proc`` before and after it."""

from __future__ import annotations

from pathlib import Path

from common import proc_cpu_ticks
from process_memory import _command, _tree

# The first role whose marker is in a process's command line; the rest is "other".
ROLES = (("web", ("daphne_server", "serve_web", "vllm", "mlx_lm.server")), ("worker", ("run_engine_worker",)),
         ("engine", ("spawn_main", "engine_loop")))
TICK_S = 0.01  # /proc's clock ticks (USER_HZ: 100 on Linux)


def role(command: str) -> str:
    for name, markers in ROLES:
        if any(marker in command for marker in markers):
            return name
    return "other"


class CpuSnapshot:
    """Each thread's CPU ticks under ``pid`` now, with its process's role."""

    def __init__(self, pid: int) -> None:
        self.threads: dict[tuple[int, int], tuple[str, int]] = {}
        for proc in _tree(pid):
            name = role(_command(proc))
            try:
                for task in Path(f"/proc/{proc}/task").iterdir():
                    self.threads[(proc, int(task.name))] = (name, proc_cpu_ticks(task / "stat"))
            except OSError:
                continue

    def since(self, before: CpuSnapshot, wall_s: float) -> dict[str, object]:
        """Cores used per role between ``before`` and this snapshot, and per role the busiest
        thread's cores (a single thread near 1.0 is a bound, whatever the role's total)."""
        cores: dict[str, float] = {}
        busiest: dict[str, float] = {}
        for key, (name, ticks) in self.threads.items():
            used = (ticks - before.threads.get(key, (name, 0))[1]) * TICK_S / wall_s
            cores[name] = cores.get(name, 0.0) + used
            busiest[name] = max(busiest.get(name, 0.0), used)
        return {"cores": {k: round(v, 2) for k, v in sorted(cores.items())},
                "busiest_thread": {k: round(v, 2) for k, v in sorted(busiest.items())}}
