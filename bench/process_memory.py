"""Peak memory of a server's process tree while a benchmark loads it: GPU memory from nvidia-smi
where there is a GPU (per process, and the whole device's use above what it was before), else
resident memory; sampled every half second on a thread."""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path


class MemorySampler:
    """Peak memory of a process and its descendants: GPU memory (nvidia-smi) where there is a
    GPU, else resident memory. Sampled every half second on a thread. ``level_processes``: each
    process's share at the level's peak (its command line, shortened: which process holds what)."""

    def __init__(self, pid: int, device_idle: int = 0) -> None:
        self.pid = pid
        self.peak_bytes = self.level_bytes = self.device_bytes = 0
        self.level_processes: dict[str, int] = {}
        self.device_idle = device_idle  # the device's use before the server started
        self.kind = "gpu" if shutil.which("nvidia-smi") else "rss"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.peak_bytes

    def level(self) -> tuple[int, int, dict[str, int]]:
        """``(processes, device above idle, per process)`` peak bytes since the last call; starts the
        next level."""
        found = self.level_bytes, self.device_bytes, self.level_processes
        self.level_bytes = self.device_bytes = 0
        self.level_processes = {}
        return found

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            pids = _tree(self.pid)
            each = _gpu_bytes(pids) if self.kind == "gpu" else {p: _rss_bytes(p) for p in pids}
            used = sum(each.values())
            self.peak_bytes = max(self.peak_bytes, used)
            if used > self.level_bytes:
                self.level_bytes = used
                self.level_processes = {f"{pid} {_command(pid)}": n for pid, n in each.items() if n}
            if self.kind == "gpu":  # nvidia-smi in a container may not see the processes' pids
                self.device_bytes = max(self.device_bytes, device_used_bytes() - self.device_idle)


def _tree(pid: int) -> set[int]:
    found, todo = {pid}, [pid]
    while todo:
        try:
            children = Path(f"/proc/{todo.pop()}/task").iterdir()
            for task in children:
                for child in (task / "children").read_text().split():
                    if int(child) not in found:
                        found.add(int(child))
                        todo.append(int(child))
        except OSError:
            continue
    return found


def _gpu_bytes(pids: set[int]) -> dict[int, int]:
    """GPU bytes of each of ``pids`` that nvidia-smi lists."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    found: dict[int, int] = {}
    for line in out.splitlines():
        pid, _, mib = line.partition(",")
        if pid.strip().isdigit() and int(pid) in pids:
            found[int(pid)] = found.get(int(pid), 0) + int(mib.strip() or 0) * 1024 * 1024
    return found


def _command(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    return " ".join(a.decode(errors="replace") for a in argv if a)[:120]


def device_used_bytes() -> int:
    """The GPU's memory in use (the first GPU), 0 without nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout.split()
    return int(out[0]) * 1024 * 1024 if out and out[0].isdigit() else 0


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
