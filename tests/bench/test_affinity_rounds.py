"""bench/affinity_bench.py: rounds of the two modes summarised by their medians."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from affinity_bench import _medians  # noqa: E402


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
