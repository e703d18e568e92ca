"""The house's shape, kept by tests: no two top-level parts of ``radixserve`` import each other.

A top-level part is a package (``core``, ``frontend``, ...) or a module (``config``,
``messages``, ...) directly under ``radixserve/``. Imports are read with ``ast`` from every
file, function-level imports included (they are how a cycle hides), so the picture in
docs/architecture.md — arrows only point down — is what the code does.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "radixserve"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every radixserve module ``path`` imports, at any depth of the file."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return {m for m in found if m.startswith("radixserve.")}


def _part(module: str) -> str | None:
    """The top-level part a module belongs to; None for the package itself and its names."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    return parts[1] if (ROOT / parts[1]).is_dir() or (ROOT / f"{parts[1]}.py").exists() else None


def _part_edges() -> dict[tuple[str, str], set[str]]:
    edges = defaultdict(set)
    for path in ROOT.rglob("*.py"):
        src = _module_name(path)
        for dst in _imports(path):
            a, b = _part(src), _part(dst)
            if a and b and a != b:
                edges[(a, b)].add(f"{src} -> {dst}")
    return edges


def test_no_two_top_level_parts_import_each_other():
    edges = _part_edges()
    cycles = [f"{a} <-> {b}: {sorted(edges[(a, b)])[:3]} / {sorted(edges[(b, a)])[:3]}"
              for a, b in edges if a < b and (b, a) in edges]
    assert not cycles, "\n".join(cycles)


def test_the_scan_sees_imports():
    """The scan is not vacuous: known downward arrows are found."""
    edges = _part_edges()
    assert ("engine", "core") in edges
    assert ("frontend", "tokenizer") in edges
    assert ("llm", "engine") in edges
