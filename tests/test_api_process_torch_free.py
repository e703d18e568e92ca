"""The API process never loads torch: each check runs in a fresh interpreter."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import radixserve

# what `radixserve serve` runs in the API process, beside everything serve.py imports
API_MODULES = ["radixserve.serve", "radixserve.frontend.app", "radixserve.cluster.replica_set"]


def _serve_imports() -> list[str]:
    """Every radixserve module serve.py imports, at the top or inside a function (what the
    engine process alone imports lives in engine/, not there)."""
    tree = ast.parse(Path(radixserve.__file__).with_name("serve.py").read_text())
    return sorted({node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                   and (node.module or "").startswith("radixserve")})


def _run(code: str) -> list[str]:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_the_api_process_modules_load_no_torch():
    modules = API_MODULES + _serve_imports()
    assert "radixserve.engine.core_proc" in modules  # the engine process's entry
    out = _run(f"""
        import importlib, sys
        for name in {modules!r}:
            importlib.import_module(name)
            if "torch" in sys.modules:
                print("torch loaded by", name)
                break
        print("done")
    """)
    assert out == ["done"]


def test_serve_help_loads_no_torch():
    out = _run("""
        import contextlib, io, sys
        from radixserve.__main__ import main
        with contextlib.redirect_stdout(io.StringIO()) as text, contextlib.suppress(SystemExit):
            main(["serve", "--help"])
        print("--mock-engine" in text.getvalue(), "torch" in sys.modules)
    """)
    assert out == ["True False"]
