"""bench/peer_bench.py's ratios: this service on SQLite (ours) and on PostgreSQL (ourspg), each against the rest."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import peer_bench  # noqa: E402


def _row(server: str, tok_s: float, ttft: float, *, max_tokens: int = 128, req_s: float = 10.0) -> dict:
    return {"server": server, "batch": 128, "concurrency": 32, "max_tokens": max_tokens, "tok_s": tok_s,
            "req_s": req_s, "ttft_p50_ms": ttft, "ready_s": 10.0, "peak_memory_gb": 2.0, "device_peak_gb": 0.0}


def test_each_service_against_the_others_once() -> None:
    rows = [_row("ours", 800.0, 300.0), _row("ourspg", 900.0, 250.0), _row("engine", 1000.0, 100.0),
            _row("ours", 0, None, max_tokens=1, req_s=50.0), _row("engine", 0, None, max_tokens=1, req_s=100.0)]
    found = peer_bench.ratios(rows)
    assert found["ours_over_engine_tok_s_b128_c32"] == 0.8
    assert found["ourspg_over_engine_tok_s_b128_c32"] == 0.9
    assert found["ours_over_ourspg_tok_s_b128_c32"] == 0.889
    assert found["ourspg_minus_engine_ttft_p50_ms_b128_c32"] == 150.0
    assert found["ours_over_engine_one_token_req_s_b128_c32"] == 0.5
    # Each pair once: ourspg is not measured against ours, and no server against itself.
    assert not any(k.startswith(("ourspg_over_ours", "ours_over_ours_", "ourspg_over_ourspg")) for k in found)
