"""bench/peer_servers.py: the engines' environment: the OpenBLAS threads scripts/run.sh would give a worker."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import peer_servers  # noqa: E402


@pytest.mark.parametrize(("cores", "threads"), [(1, "1"), (2, "1"), (4, "3"), (8, "8")])
def test_engines_leave_one_core_to_the_rest_on_a_small_machine(monkeypatch, cores, threads):
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setattr(peer_servers.os, "cpu_count", lambda: cores)
    assert peer_servers.engine_blas_env() == {"OPENBLAS_NUM_THREADS": threads}


def test_a_blas_thread_count_already_set_is_kept(monkeypatch):
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert peer_servers.engine_blas_env() == {}
