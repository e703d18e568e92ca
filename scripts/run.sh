#!/usr/bin/env bash
# Set everything up, then run radixserve on the embedded model.
# No arguments: `radixserve generate`'s demo (a question answered in the chat template, sampled
# as the model recommends, with a repetition guard).
# With arguments: they are passed to the radixserve CLI (e.g. scripts/run.sh chat, or
# scripts/run.sh generate --model hf.co/OWNER/REPO:Q4_K_M "Hello").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ $# -eq 0 ]; then
  set -- generate
fi
exec .venv/bin/radixserve "$@"
