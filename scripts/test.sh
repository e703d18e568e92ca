#!/usr/bin/env bash
# Set everything up, then run the test suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
.venv/bin/python -m pytest -q
# The torch fallback (machines without g++ or AVX-512 VNNI): the embedded model's equivalence
# tests again with the native kernels off.
RADIXSERVE_NATIVE_KERNELS=0 .venv/bin/python -m pytest -q tests/engine/test_llm_embedded.py
