"""Headless Chromium (Debian's ``chromium`` package) driven by Playwright, for the UI tests.

Never ``playwright install``: the browser is the system one (scripts/setup.sh installs it).
The tests skip, naming the install command, when either is missing.
"""

from __future__ import annotations

import shutil

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def launch_chromium(playwright):
    if not shutil.which("chromium"):
        pytest.skip("chromium is not installed: apt-get install -y chromium (scripts/setup.sh)")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with sync_api.sync_playwright() as p:
        b = launch_chromium(p)
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    """Where the screenshots go (pytest's tmp dir: look, do not commit)."""
    path = tmp_path_factory.mktemp("ui_screenshots")
    print(f"\nscreenshots: {path}")
    return path


def watch_errors(page) -> list[str]:
    """Collect the page's uncaught errors and console errors (not the browser's own line
    for a refused request: a 401 before the key is given is how the page learns it needs one)."""
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error"
            and not m.text.startswith("Failed to load resource") else None)
    return errors
