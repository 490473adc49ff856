"""No first-party module imports, directly or through others, a module that imports it back.

Every import counts, those inside functions included: an import deferred into a function to dodge
a circle at load time still ties the two modules together. Only ``if TYPE_CHECKING:`` blocks are
left out (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("api", "inference_service", "engine_worker", "demo_model", "bench")


def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _imported(tree: ast.AST, name: str, is_package: bool, modules: dict[str, Path]) -> set[str]:
    """The first-party modules ``name`` imports, with the packages that importing them initialises;
    except ``name``'s own packages where it only imports their modules (``from pkg import module``):
    those are initialising already when ``name`` runs."""
    targets: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) + is_package - node.level]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                targets.add(sub if sub in modules else module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found = set()
    for target in targets:
        parts = target.split(".")
        known = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in modules), None)
        if known is None:
            continue
        found.add(known)
        parts = known.split(".")
        for i in range(1, len(parts)):
            package = ".".join(parts[:i])
            if not name.startswith(package + "."):
                found.add(package)
    found.discard(name)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_first_party_import_cycles():
    modules = _modules()
    graph = {
        name: _imported(ast.parse(path.read_text()), name, path.name == "__init__.py", modules)
        for name, path in modules.items()
    }
    assert _cycles(graph) == []
