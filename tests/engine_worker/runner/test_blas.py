"""The OpenBLAS preload: it comes before mlx wherever the engine runs, never in a process that only
imports the web side's engine modules, and only a library that can run on this CPU is loaded."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from engine_worker.runner.blas import unsupported_reason

ROOT = Path(__file__).resolve().parents[3]

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
        "from engine_worker.runner.mlx_core import mx\n"
        "from engine_worker.runner.blas import blas_status\n"
        "a = mx.ones((256, 256))\n"
        "assert (a @ a).sum().item() == 256.0 ** 3, 'wrong product'\n"
        "print(blas_status())\n"
    )
    done = _run(code)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])


# A fresh process's answer: is mlx imported, and is the OpenBLAS the preload names mapped into it
# (by its real path: Debian's libopenblas.so.0 is a link to openblas-pthread/libopenblasp-*.so)?
# With no preload, is any OpenBLAS mapped (not numpy's own, which is named libscipy_openblas)?
_LOADED = (
    "import os, sys\n"
    "from engine_worker.runner.blas import blas_status\n"
    "maps = open('/proc/self/maps').read()\n"
    "path = blas_status()['path']\n"
    "mapped = os.path.realpath(path) in maps if path else ('libopenblas.so' in maps or 'libopenblasp' in maps)\n"
    "print('mlx.core' in sys.modules, mapped, blas_status()['reason'])\n"
)


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_the_web_sides_imports_of_the_engine_package_load_neither_mlx_nor_openblas():
    done = _run("import engine_worker.protocol, engine_worker.runtime, engine_worker.common.errors\n" + _LOADED)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "False", "not", "attempted"]


def test_importing_the_engine_loads_openblas_before_mlx():
    done = _run("import engine_worker.engine_core\n" + _LOADED)
    assert done.returncode == 0, done.stderr[-2000:]
    mlx_loaded, openblas_mapped, reason = done.stdout.split(maxsplit=2)
    assert mlx_loaded == "True"
    assert reason.strip() != "mlx was imported before the BLAS preload"
    if reason.strip() == "ok":
        assert openblas_mapped == "True"


def _mlx_import(node: ast.stmt) -> bool:
    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
    return any(n == "mlx" or n.startswith(("mlx.", "mlx_lm")) for n in names)


def _preload_import(node: ast.stmt) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name == "engine_worker.runner.mlx_core" for a in node.names)
    return node.module == "engine_worker.runner.mlx_core"


def _late_mlx_imports(body: list[ast.stmt], preloaded: bool) -> list[int]:
    """Lines of mlx imports in ``body`` (and the functions in it) with no mlx_core import before
    them in their scope or an enclosing one."""
    late = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if _preload_import(node):
                preloaded = True
            elif _mlx_import(node) and not preloaded:
                late.append(node.lineno)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            late += _late_mlx_imports(node.body, preloaded)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                late += _late_mlx_imports(getattr(node, field, []), preloaded)
    return late


def test_every_engine_and_bench_module_imports_mlx_only_after_the_preload():
    """Whichever module a process imports first, OpenBLAS is loaded before mlx (mlx-lm loads
    mlx.core too)."""
    offenders = []
    for package in ("engine_worker", "bench"):
        for path in (ROOT / package).rglob("*.py"):
            if path.name == "mlx_core.py":
                continue
            for line in _late_mlx_imports(ast.parse(path.read_text()).body, preloaded=False):
                offenders.append(f"{path.relative_to(ROOT)}:{line}")
    assert offenders == []
