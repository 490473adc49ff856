"""bench/process_cpu.py: where a level's CPU went, by role, from /proc; and peer_bench's Redis commands per token."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import peer_bench  # noqa: E402
import process_cpu  # noqa: E402


def test_processes_are_told_apart_by_their_command_lines() -> None:
    assert process_cpu.role("python -m inference_service.daphne_server --fd 3 inference_service.asgi:application") == "web"
    assert process_cpu.role("python manage.py run_engine_worker --loglevel WARNING") == "worker"
    assert process_cpu.role("python -B -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=6)") == "engine"
    assert process_cpu.role("redis-server 127.0.0.1:6379") == "other"


def test_a_busy_child_counts_against_its_role_and_its_busiest_thread() -> None:
    # A process named like the engine that spins for the whole interval, under a parent that sleeps.
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                               "'import time\\nend = time.time() + 1.5\\nwhile time.time() < end: pass', 'engine_loop'])"])
    try:
        time.sleep(0.3)
        before, started = process_cpu.CpuSnapshot(parent.pid), time.perf_counter()
        time.sleep(0.8)
        found = process_cpu.CpuSnapshot(parent.pid).since(before, time.perf_counter() - started)
    finally:
        parent.wait(10)
    assert 0.5 < found["cores"]["engine"] <= 1.2
    assert found["busiest_thread"]["engine"] == found["cores"]["engine"]  # one thread did it all
    assert found["cores"].get("other", 0.0) < 0.2


def test_redis_commands_per_token_name_the_busiest_commands_and_the_total() -> None:
    before = {"xadd": 100, "expire": 100, "xread": 10, "info": 3}
    after = {"xadd": 300, "expire": 110, "xread": 30, "info": 4, "exec": 5}
    found = peer_bench.per_token(before, after, tokens=200)
    assert found == {"xadd": 1.0, "xread": 0.1, "expire": 0.05, "exec": 0.025, "info": 0.005, "all": 1.18}
    assert peer_bench.per_token({}, {}, tokens=200) == {}
