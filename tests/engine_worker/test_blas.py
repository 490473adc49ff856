"""The OpenBLAS preload: only a library that can run on this CPU is put in front of mlx."""

from __future__ import annotations

import subprocess
import sys

from engine_worker.blas import unsupported_reason

AVX2_EPYC = {"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"}
AVX512_XEON = AVX2_EPYC | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}


def test_a_skylakex_only_build_is_refused_on_a_cpu_without_avx512():
    reason = unsupported_reason("OpenBLAS 0.3.31 NO_AFFINITY SKYLAKEX MAX_THREADS=4", AVX2_EPYC)
    assert reason is not None and "SKYLAKEX" in reason and "avx512f" in reason


def test_a_skylakex_only_build_is_accepted_where_the_cpu_has_avx512():
    assert unsupported_reason("OpenBLAS 0.3.31 NO_AFFINITY SKYLAKEX MAX_THREADS=4", AVX512_XEON) is None


def test_a_dynamic_arch_build_runs_anywhere():
    config = "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64"
    assert unsupported_reason(config, {"sse2"}) is None


def test_a_haswell_build_needs_avx2_and_fma():
    assert unsupported_reason("OpenBLAS 0.3.26 HASWELL MAX_THREADS=8", {"avx"}) is not None
    assert unsupported_reason("OpenBLAS 0.3.26 HASWELL MAX_THREADS=8", AVX2_EPYC) is None


def test_unknown_flags_or_core_do_not_block_the_preload():
    assert unsupported_reason("OpenBLAS 0.3.26 SKYLAKEX", None) is None
    assert unsupported_reason("OpenBLAS 0.3.26 NEOVERSEN1", AVX2_EPYC) is None


def test_a_matmul_runs_after_the_preload_on_this_machine():
    """In a fresh process, as the worker starts: the preload, then mlx's sgemm. With a library
    built for instructions this CPU lacks, this died with SIGILL."""
    code = (
        "import engine_worker.blas as b, mlx.core as mx\n"
        "a = mx.ones((256, 256))\n"
        "assert (a @ a).sum().item() == 256.0 ** 3, 'wrong product'\n"
        "print(b.blas_status())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
