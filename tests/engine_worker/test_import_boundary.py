"""engine_worker never imports the web stack, so it can be imported and run without Django; and
only its runner (with the few cache modules that handle KV arrays) imports mlx."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "engine_worker"
FORBIDDEN = ("django", "rest_framework", "channels", "celery", "api", "inference_service", "daphne")
MLX = ("mlx", "mlx_lm")
# The cache modules that handle KV arrays themselves: snapshots of mlx-lm caches and their
# quantization (kv), their host copies for the disk (entry_io), and the paged cache's blocks, cut
# from a request's cache and joined into fresh ones (paged_cache). Every other cache module reaches
# mlx through them.
MLX_OUTSIDE_RUNNER = {"cache/kv.py", "cache/entry_io.py", "cache/paged_cache.py"}


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_engine_module_imports_the_web_stack():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for name in _imported_modules(path):
            if name.split(".")[0] in FORBIDDEN:
                offenders.append(f"{path.relative_to(PACKAGE.parent)}: {name}")
    assert not offenders


def test_importing_the_engine_loads_no_web_module():
    code = (
        "import sys, engine_worker.engine_core, engine_worker.scheduler;"
        f"bad = [m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}];"
        "print(','.join(bad))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""



def _imports_mlx(path: Path) -> bool:
    return any(name.split(".")[0] in MLX or name == "engine_worker.runner.mlx_core"
               for name in _imported_modules(path))


def test_only_the_runner_and_the_kv_array_modules_of_the_cache_import_mlx():
    importers = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py") if _imports_mlx(path)}
    assert {name for name in importers if not name.startswith("runner/")} == MLX_OUTSIDE_RUNNER
