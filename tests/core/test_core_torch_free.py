"""core/ is plain Python at the bottom of the engine: importing it (and the engine options)
loads no torch, and no module under radixserve/core imports any other radixserve package but
the request parameter leaves."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import radixserve

CORE = Path(radixserve.__file__).parent / "core"
ALLOWED_OUTSIDE = {"radixserve.sampling_params", "radixserve.pooling_params"}


def test_importing_core_and_config_loads_no_torch():
    code = ("import sys\n"
            "import radixserve.core.scheduler, radixserve.core.kv.radix_cache\n"
            "import radixserve.core.kv.kv_manager, radixserve.config\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _imported_modules(path: Path) -> list[str]:
    """Every module ``path`` imports, at any depth (inside functions and ``TYPE_CHECKING``
    blocks too); ``from package import name`` counts as ``package.name``."""
    package = ".".join(path.relative_to(CORE.parent.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0]
                base = f"{parent}.{base}" if base else parent
            found += [base] if base != "radixserve" else [f"radixserve.{a.name}"
                                                          for a in node.names]
    return found


def _is_allowed(module: str) -> bool:
    top = module.split(".")[0]
    if top == "torch":
        return False
    return (top != "radixserve" or module in ALLOWED_OUTSIDE
            or module == "radixserve.core" or module.startswith("radixserve.core."))


def test_core_imports_nothing_above_it():
    wrong = [f"{path.relative_to(CORE.parent)}: {module}"
             for path in sorted(CORE.rglob("*.py"))
             for module in _imported_modules(path) if not _is_allowed(module)]
    assert not wrong, "core/ imports outside core/ (or torch): " + ", ".join(wrong)
