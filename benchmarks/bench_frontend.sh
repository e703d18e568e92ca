#!/usr/bin/env bash
# Frontend cost alone: radixserve serve --mock-engine (no model), driven by wrk (a native load
# generator, so the client is not the bottleneck). 512-token prompt, 128 streamed output tokens.
# Usage: bash benchmarks/bench_frontend.sh [concurrencies...]   (default: 1 64 512)
# Needs wrk (apt-get install wrk). TTFT/ITL come from the server's own Prometheus histograms.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${PORT:-8311}
DURATION=${DURATION:-15s}
.venv/bin/radixserve serve --mock-engine --port "$PORT" --max-num-seqs 1024 > /tmp/radixserve-mock.log 2>&1 &
PID=$!
trap 'kill -TERM $PID 2>/dev/null; wait $PID 2>/dev/null' EXIT
for _ in $(seq 1 60); do sleep 1; curl -sf "localhost:$PORT/version" > /dev/null && break; done
for c in "${@:-1 64 512}"; do
  for conc in $c; do
    curl -s "localhost:$PORT/metrics" > /tmp/radixserve-metrics-before.txt
    printf "concurrency %4d: " "$conc"
    wrk -t 1 -c "$conc" -d "$DURATION" --timeout 60s -s benchmarks/frontend_post.lua \
      "http://127.0.0.1:$PORT/v1/completions" | tail -1
    curl -s "localhost:$PORT/metrics" > /tmp/radixserve-metrics-after.txt
    printf "                  server-side (from HTTP arrival): "
    .venv/bin/python benchmarks/metrics_delta.py /tmp/radixserve-metrics-before.txt \
      /tmp/radixserve-metrics-after.txt
  done
done
