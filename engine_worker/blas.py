"""Load a fast BLAS before mlx on Linux CPU.

The ``mlx-cpu`` wheel links ``cblas_sgemm`` from a bundled netlib *reference* BLAS: about
3 GFLOP/s on the dev machine, so batching gives no speedup at all. Loading OpenBLAS with
``RTLD_GLOBAL`` before the first ``import mlx.core`` makes the dynamic linker resolve those
symbols to OpenBLAS instead (150-260 GFLOP/s, mlx-notes.md section 4).

Import this module (or call :func:`preload_openblas`) before anything imports ``mlx``. It is a
no-op on macOS and when mlx is already imported, and it never fails: without OpenBLAS the engine
still runs, only slower, and :func:`blas_status` says so.
"""

from __future__ import annotations

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
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:  # e.g. libgfortran.so.5 missing
            errors.append(f"{path}: {exc}")
            continue
        _status.update(loaded=True, path=str(path), reason="ok")
        return True
    _status["reason"] = "; ".join(errors) or "no OpenBLAS library found"
    logger.warning("OpenBLAS not loaded, mlx uses its slow reference BLAS: %s", _status["reason"])
    return False


def blas_status() -> dict[str, str | bool | None]:
    """What :func:`preload_openblas` did, for stats and the README's troubleshooting."""
    return dict(_status)


preload_openblas()
