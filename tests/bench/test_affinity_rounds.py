"""bench/affinity_bench.py: rounds of the two modes summarised by their medians; each run's probe files."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from affinity_bench import _medians, _probes_of_run  # noqa: E402


def _run(hit_rate: float, ttft: float) -> dict:
    return {"hit_rate": hit_rate, "ttft_p50_ms": ttft}


def test_medians_over_rounds_and_the_ratio_per_round() -> None:
    results = {"affinity": [_run(0.93, 900.0), _run(0.90, 1500.0), _run(0.95, 1000.0)],
               "shared": [_run(0.90, 800.0), _run(0.91, 1200.0), _run(0.89, 1100.0)]}
    out = _medians(results)
    assert out["hit_rate_affinity"] == 0.93 and out["hit_rate_shared"] == 0.90
    assert out["ttft_p50_ms_affinity"] == 1000.0 and out["ttft_p50_ms_shared"] == 1100.0
    assert out["ttft_speedup"] == 1.1
    assert out["ttft_speedup_per_round"] == [0.889, 0.8, 1.1]


def test_one_mode_alone_gives_its_figures_and_no_ratio() -> None:
    out = _medians({"affinity": [_run(0.92, 700.0)]})
    assert out["hit_rate_affinity"] == 0.92 and out["hit_rate_shared"] is None
    assert out["ttft_speedup"] is None and out["ttft_speedup_per_round"] == []


def test_a_mode_named_twice_leaves_its_extra_runs_unpaired() -> None:
    out = _medians({"affinity": [_run(0.9, 500.0), _run(0.9, 400.0)], "shared": [_run(0.8, 600.0)]})
    assert out["ttft_p50_ms_affinity"] == 450.0 and out["ttft_speedup_per_round"] == [1.2]


def test_each_run_writes_its_own_probe_files_and_database(monkeypatch):
    """Under the probes, a run's files and SQLite database carry its mode and round, so each run's
    phases can be read alone; probes that are off stay off, and PostgreSQL stays as configured."""
    monkeypatch.setenv("TTFT_PROBE", "/tmp/ttft/p")
    monkeypatch.setenv("LOCK_PROBE", "/tmp/lock")
    monkeypatch.delenv("STEP_PROBE", raising=False)
    env = _probes_of_run("shared2", "sqlite:////tmp/service_bench.sqlite3")
    assert env == {"TTFT_PROBE": "/tmp/ttft/p.shared2", "LOCK_PROBE": "/tmp/lock.shared2",
                   "DATABASE_URL": "sqlite:////tmp/ttft/p.shared2.sqlite3"}
    assert "DATABASE_URL" not in _probes_of_run("affinity1", "postgresql://postgres@127.0.0.1:5432/bench")


def test_without_probes_a_run_changes_nothing(monkeypatch):
    for name in ("TTFT_PROBE", "LOCK_PROBE", "STEP_PROBE"):
        monkeypatch.delenv(name, raising=False)
    assert _probes_of_run("affinity1", "sqlite:////tmp/service_bench.sqlite3") == {}
