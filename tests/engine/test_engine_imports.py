"""Imports point down (an ast scan of radixserve/, imports inside functions included): the
engine's composition root, its loop and the tensor-parallel ranks form no cycle, and none of
these packages import each other."""

from __future__ import annotations

import ast
from pathlib import Path

import radixserve

ROOT = Path(radixserve.__file__).parent
ONE_WAY = [("engine", "cluster"), ("engine", "parallel"), ("parallel", "models"),
           ("cluster", "frontend"), ("cluster", "serve")]


def _imports() -> dict[str, set[str]]:
    """module → the radixserve modules (or packages) it imports, anywhere in the file."""
    graph = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(("radixserve",) + path.relative_to(ROOT).with_suffix("").parts)
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[name.removesuffix(".__init__")] = {m for m in found if m.startswith("radixserve.")}
    return graph


def _package(module: str) -> str:
    return (module.split(".") + [""])[1]  # "" for radixserve itself


def test_no_two_of_these_packages_import_each_other():
    edges = {(_package(a), _package(b)) for a, found in _imports().items() for b in found}
    assert [pair for pair in ONE_WAY if pair in edges and pair[::-1] in edges] == []


def test_no_cycle_among_the_engine_loop_its_build_and_the_ranks():
    graph = _imports()
    engine = {m for m in graph if m.startswith("radixserve.engine.")}
    deps = {m: {n for n in engine if n != m and n in graph[m]} for m in engine}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and not seen.add(n) and reaches(n, goal, seen))
                   for n in deps[start])

    assert sorted(m for m in engine if reaches(m, m, set())) == []
