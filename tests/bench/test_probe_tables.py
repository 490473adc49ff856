"""The probes' tables: step times by batch-size band, and how many jobs pass each point together."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path[:0] = [str(BENCH), str(BENCH / "probes")]

import probe_step_times  # noqa: E402
import ttft_phases  # noqa: E402


def _row(steps: int, step_ms: float) -> dict:
    return {"steps": steps, "step_ms": step_ms, "thread_cpu_ms": step_ms / 2, "dispatch_ms": 0.1, "gap_ms": 0.0}


def test_the_step_table_weights_each_band_by_its_steps(tmp_path, capsys):
    (tmp_path / "steps.11.json").write_text(json.dumps({
        "pid": 11, "argv": ["engine_loop.py"], "gc": {}, "modules": 9,
        "by_batch": {"1": _row(10, 4.0), "20": _row(30, 8.0), "32": _row(10, 12.0)}}))
    (tmp_path / "steps.12.json").write_text(json.dumps({"pid": 12, "argv": ["manage.py"], "by_batch": {}}))
    probe_step_times._table(str(tmp_path / "steps"), [1, 16, 32])
    out = capsys.readouterr().out
    assert "steps.12.json" not in out  # a process that ran no step prints nothing
    lines = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert lines[0][:3] == ["1-1", "10", "4.00"]
    assert lines[1][:3] == ["17-32", "40", "9.00"]  # (30 x 8 + 10 x 12) / 40
    assert len(lines) == 2  # the empty band 2-16 is left out


def test_group_sizes_count_the_jobs_of_each_call_per_point(tmp_path, capsys):
    lines = [{"point": "claimed", "at": 1.0, "jobs": ["a", "b", "c"]},
             {"point": "claimed", "at": 2.0, "jobs": ["d"]},
             {"point": "first_token", "at": 3.0, "jobs": ["a", "b"]}]
    (tmp_path / "p.7.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    ttft_phases.group_sizes(str(tmp_path / "p"))
    out = capsys.readouterr().out
    assert "claimed 2 calls, p50 2.0, mean 2.0" in out
    assert "first_token 1 calls, p50 2, mean 2.0" in out


def test_the_step_table_parts_prompt_steps_from_decode_steps(tmp_path, capsys):
    (tmp_path / "steps.13.json").write_text(json.dumps({
        "pid": 13, "argv": ["manage.py"], "by_batch": {"100": _row(10, 20.0)},
        "prompt_steps": {"100": _row(2, 60.0)}}))
    (tmp_path / "steps.14.json").write_text('{"pid": 14, "by_ba')  # cut mid-write
    probe_step_times._table(str(tmp_path / "steps"), [64, 128])
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("65-128"))
    assert row[1:3] == ["10", "20.00"]
    assert row[-3:] == ["2", "60.00", "10.00"]  # (10 x 20 - 2 x 60) / 8 decode-only
    assert "steps.14.json: unreadable, skipped" in out
