"""No module of radixserve uses another module's private name: what crosses a module boundary
has a public name (and a docstring saying its contract).

Two checks over every ``.py`` under radixserve/, by ``ast``: no ``from radixserve.X import
_name``, and no ``module._name`` where ``module`` is a radixserve module bound by an import
(``from radixserve.x import y`` / ``import radixserve.x as y``). Attribute access through
objects (``self.inner._x``) is beyond a static check."""

from __future__ import annotations

import ast
from pathlib import Path

import radixserve

ROOT = Path(radixserve.__file__).parent



def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_names() -> set[str]:
    names = set()
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _private_uses(path: Path, modules: set[str]) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    bound: set[str] = set()  # local names bound to a radixserve module
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] == "radixserve":
            for alias in node.names:
                if _is_private(alias.name):
                    found.append((node.lineno, alias.name))
                if f"{node.module}.{alias.name}" in modules:
                    bound.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "radixserve":
                    bound.add(alias.asname or "radixserve")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):  # radixserve.x.y._z
                base = base.value
            if isinstance(base, ast.Name) and base.id in bound:
                found.append((node.lineno, node.attr))
    return found


def test_no_module_uses_another_modules_private_names():
    modules = _module_names()
    found = {(str(path.relative_to(ROOT)), name, line)
             for path in sorted(ROOT.rglob("*.py"))
             for line, name in _private_uses(path, modules)}
    unexpected = sorted(found)
    assert not unexpected, "\n".join(f"radixserve/{p}:{line}: {name}"
                                     for p, name, line in unexpected)


def test_the_check_sees_both_forms(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from radixserve.frontend.openai.routes import _parse\n"
                      "from radixserve.frontend.http import body_reader\n"
                      "import radixserve.frontend.app as app\n"
                      "body_reader._hidden(); app._Guard; body_reader.__name__\n")
    found = _private_uses(sample, _module_names())
    assert sorted(name for _, name in found) == ["_Guard", "_hidden", "_parse"]
