#!/usr/bin/env bash
# Set everything up, then run radixserve on the embedded model.
# No arguments: generate a continuation of "The capital of France is".
# With arguments: they are passed to the radixserve CLI (e.g. scripts/run.sh chat).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ $# -eq 0 ]; then
  set -- generate "The capital of France is"
fi
exec .venv/bin/radixserve "$@"
