"""The probes' tables: step times by batch-size band, how many jobs pass each point together, the
row's way to its claim, and who holds SQLite's write lock."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path[:0] = [str(BENCH), str(BENCH / "probes")]

import probe_step_times  # noqa: E402
import probe_write_lock  # noqa: E402
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


def test_the_row_to_its_claim_is_timed_for_the_jobs_their_own_message_claimed(capsys):
    own = {"queued": 0.0, "admission": 0.004, "dispatch": 0.030, "committed": 0.040, "received": 0.035,
           "started": 0.0351, "claimed": 0.040}
    claimed_with_another = {"queued": 0.0, "admission": 0.002, "dispatch": 0.020, "committed": 0.025,
                            "started": 0.010, "claimed": 0.015}  # no "received": another message claimed it
    ttft_phases.table([own, claimed_with_another], ttft_phases.OWN_MESSAGE, "the row to its claim")
    out = capsys.readouterr().out
    assert "the row to its claim: 1 of 2 requests passed every point" in out
    assert "admission -> dispatch      p50    26.0 ms" in out
    assert "committed -> received      p50    -5.0 ms" in out


def test_the_lock_table_merges_processes_per_writer_and_orders_them_by_time_held(tmp_path, capsys, monkeypatch):
    (tmp_path / "l.1.json").write_text(json.dumps({"job_create": {"wait": [1.0, 3.0], "hold": [5.0, 7.0]}}))
    (tmp_path / "l.2.json").write_text(json.dumps({"job_create": {"wait": [2.0], "hold": [6.0]},
                                                   "jobs_claim": {"wait": [0.0], "hold": [0.5]}}))
    monkeypatch.setattr(sys, "argv", ["probe_write_lock.py", str(tmp_path / "l")])
    probe_write_lock.main()
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert rows[0][:6] == ["job_create", "3", "2.0", "3.0", "6.0", "7.0"]
    assert rows[0][6] == "18"  # ms held in all
    assert rows[1][:2] == ["jobs_claim", "1"]
