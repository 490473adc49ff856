"""engine_worker never imports the web stack, so it can be imported and run without Django."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "engine_worker"
FORBIDDEN = ("django", "rest_framework", "channels", "celery", "api", "inference_service", "daphne")


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
