"""Load a fast BLAS before mlx on Linux CPU.

The ``mlx-cpu`` wheel links ``cblas_sgemm`` from a bundled netlib *reference* BLAS, some fifty
times slower than OpenBLAS (bench/blas_gemm.py measures both), so batching gives no speedup. Loading
OpenBLAS with ``RTLD_GLOBAL`` before the first ``import mlx.core`` makes the dynamic linker
resolve those symbols to OpenBLAS instead.

:mod:`engine_worker.runner.mlx_core` calls :func:`preload_openblas` before it imports ``mlx.core``;
importing this module loads nothing. The preload is a no-op on macOS and when mlx is already
imported, and it never fails: without OpenBLAS the engine still runs, only slower, and
:func:`blas_status` says so.

A library built for one CPU (no ``DYNAMIC_ARCH``) is only loaded where the CPU has the
instructions its kernels use. cmeel-openblas 0.3.31 is built for SKYLAKEX: on a CPU without
AVX-512 its first sgemm dies with SIGILL (``vmovups %zmm0`` in ``sgemm_beta``), taking the
process with it. Such a library is skipped and the next candidate tried: Debian's
``libopenblas0-pthread`` is a DYNAMIC_ARCH build that picks its kernels at run time.
"""

from __future__ import annotations

import _ctypes
import ctypes
import logging
import os
import sys
import sysconfig
from pathlib import Path

logger = logging.getLogger(__name__)

_status: dict[str, str | bool | None] = {"loaded": False, "path": None, "reason": "not attempted"}


def _candidates() -> list[Path]:
    explicit = os.environ.get("MLX_OPENBLAS_PATH")
    paths = [Path(explicit)] if explicit else []
    site = Path(sysconfig.get_paths()["purelib"])
    paths.append(site / "cmeel.prefix" / "lib" / "libopenblas.so.0")
    paths.append(Path("/usr/lib/x86_64-linux-gnu/libopenblas.so.0"))
    paths.append(Path("/usr/lib/aarch64-linux-gnu/libopenblas.so.0"))
    return paths


def preload_openblas() -> bool:
    """Load OpenBLAS globally if possible. Returns True when it is loaded."""
    if _status["loaded"]:
        return True
    if sys.platform != "linux" or os.environ.get("MLX_DISABLE_OPENBLAS") == "1":
        _status["reason"] = "disabled or not Linux"
        return False
    if "mlx.core" in sys.modules:
        _status["reason"] = "mlx was imported before the BLAS preload"
        logger.warning("OpenBLAS preload skipped: mlx.core is already imported")
        return False
    errors = []
    for path in _candidates():
        if not path.exists():
            continue
        try:
            # Locally first: reading the build's config runs no kernel and interposes nothing.
            local = ctypes.CDLL(str(path))
            problem = unsupported_reason(_build_config(local), _cpu_flags())
            if problem:
                _ctypes.dlclose(local._handle)
                errors.append(f"{path}: {problem}")
                continue
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)  # the same handle, now global
        except OSError as exc:  # e.g. libgfortran.so.5 missing
            errors.append(f"{path}: {exc}")
            continue
        _status.update(loaded=True, path=str(path), reason="ok")
        return True
    _status["reason"] = "; ".join(errors) or "no OpenBLAS library found"
    logger.warning("OpenBLAS not loaded, mlx uses its slow reference BLAS: %s", _status["reason"])
    return False


# Instruction-set flags (as /proc/cpuinfo spells them) that OpenBLAS's kernels for a core need.
_CORE_NEEDS = {
    "SANDYBRIDGE": {"avx"},
    "HASWELL": {"avx2", "fma"},
    "ZEN": {"avx2", "fma"},
    "SKYLAKEX": {"avx512f", "avx512bw", "avx512vl", "avx512dq"},
    "COOPERLAKE": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"},
    "SAPPHIRERAPIDS": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"},
}


def unsupported_reason(config: str, cpu_flags: set[str] | None) -> str | None:
    """Why an OpenBLAS build (its ``openblas_get_config()``) cannot run on a CPU with
    ``cpu_flags``, or None if it can (or nothing can be told: no flags, or an unknown core)."""
    words = config.upper().split()
    if "DYNAMIC_ARCH" in words or cpu_flags is None:
        return None
    for core, needs in _CORE_NEEDS.items():
        if core in words and not needs <= cpu_flags:
            return f"built for {core} only; this CPU lacks {', '.join(sorted(needs - cpu_flags))}"
    return None


def _build_config(lib: ctypes.CDLL) -> str:
    try:
        get_config = lib.openblas_get_config
    except AttributeError:
        return ""
    get_config.restype = ctypes.c_char_p
    return (get_config() or b"").decode(errors="replace")


def _cpu_flags() -> set[str] | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return None  # not x86 (aarch64 says "Features"): nothing to check


def blas_status() -> dict[str, str | bool | None]:
    """What :func:`preload_openblas` did, for stats and the engine docs' troubleshooting (docs/engine.md)."""
    return dict(_status)

