#!/usr/bin/env bash
# Set everything up, then run the test suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
.venv/bin/python -m pytest -q
# The embedded model's equivalence tests again at every other CPU level this machine runs
# (RADIXSERVE_CPU_ISA forces one: avx2 and generic on every x86-64 CI machine), and with the
# native kernels off (the torch paths, where no kernel library is installed).
levels=$(.venv/bin/python -c "from radixserve.kernels import native; i = native.describe()
print(' '.join(lv for lv in i.runnable if lv in i.built and lv != i.level))")
for level in $levels; do
  echo "== the embedded model's equivalence tests at the $level level"
  RADIXSERVE_CPU_ISA=$level .venv/bin/python -m pytest -q tests/engine/test_llm_embedded.py
done
echo "== the embedded model's equivalence tests on the torch paths"
RADIXSERVE_NATIVE_KERNELS=0 .venv/bin/python -m pytest -q tests/engine/test_llm_embedded.py
