"""The docs: the site builds with `mkdocs build --strict` (no broken link or anchor, no page
left out of the nav), and README.md stays one screen whose relative links all resolve."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 150
# [text](target): inline links; a target ends at whitespace or ")" (an optional "title" after)
_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def relative_link_targets(markdown: str) -> list[str]:
    """The link targets of `markdown` that are paths in the repository: no URL scheme, no
    pure `#anchor`; any `#anchor` or `?query` is cut off."""
    targets = []
    for target in _LINK.findall(markdown):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue
        targets.append(re.split(r"[#?]", target, maxsplit=1)[0])
    return targets


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (site / "index.html").is_file()


def test_readme_fits_one_screen() -> None:
    num_lines = len(README.read_text(encoding="utf-8").splitlines())
    assert num_lines <= MAX_README_LINES, f"README.md has {num_lines} lines"


def test_readme_relative_links_exist() -> None:
    targets = relative_link_targets(README.read_text(encoding="utf-8"))
    assert any(t.startswith("docs/") for t in targets)  # the parser finds the docs links
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_link_parser() -> None:
    text = ('[a](docs/x.md) [b](https://e.org/y) [c](#top) [d](docs/y.md#sec) '
            '[e](docs/z.md "title") [f](mailto:me@e.org)')
    assert relative_link_targets(text) == ["docs/x.md", "docs/y.md", "docs/z.md"]
