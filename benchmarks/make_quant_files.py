"""Real GGUF files of every tensor type, made exactly as users get them: llama.cpp's own tools.

From one source GGUF (e.g. the real Qwen2.5-Coder-1.5B Q4_K_M, ``../shared/MODELS.md``), each type
asked is made with ``llama-quantize --allow-requantize [--imatrix F] SRC OUT TYPE`` into
``OUT_DIR/<src stem>-<TYPE>.gguf``; then each file's size and its tensor-type histogram (share of
the file's tensor bytes per type, from ``gguf.GGUFReader``) is printed. Files already there are
kept (``--force`` remakes them).

The types that llama-quantize refuses to make without an importance matrix (IQ1_S, IQ1_M, IQ2_XXS,
IQ2_XS, IQ2_S, IQ2_M, Q2_K_S: "the result will be garbage") and the other IQ2/IQ3 ones (which
people always make with one) get an imatrix made once per source:
``llama-imatrix -m SRC -f TEXT -o F -c 512 --chunks 24 --no-repack`` over TEXT, by default this
repository's ``docs/*.md`` joined (about 35k tokens; any text will do).

What llama-quantize makes of a dense model, per type: the named type in most matrices, with its
own mix around it (the output head Q6_K or Q5_K, the token embedding Q2_K..Q4_K, some attn_v and
ffn_down one step up; Q3_K_S/M and Q2_K are such mixes by name). Three caveats on a dense
model:

* ``MXFP4_MOE`` quantizes only MoE expert tensors to MXFP4 and every other one to Q8_0, so on a
  dense model it makes an all-Q8_0 file. ``MXFP4_FFN`` here is ``MXFP4_MOE`` with
  ``--tensor-type ffn_{up,gate,down}=mxfp4``: MXFP4 in the dense MLP, Q8_0 elsewhere.
* ``IQ2_S`` (the file type) puts IQ2_XS in the matrices; IQ2_S tensors come with ``IQ2_M``
  (and as every attn_q / attn_k of ``IQ3_XXS``).
* ``TQ1_0`` / ``TQ2_0`` are exact only for ternary-trained weights (BitNet b1.58, TriLMs): from a
  float model they load and run, but the text they produce is noise.

Run every quantization at low priority on a shared machine:

    LLAMA_CPP_BIN=/path/to/llama.cpp/bin nice -n 19 .venv/bin/python \\
        benchmarks/make_quant_files.py --src /work/models/coder15.gguf --out-dir /work/models/quant
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DEFAULT_TYPES = ("Q2_K,Q3_K_S,Q3_K_M,IQ4_XS,IQ4_NL,IQ3_XXS,IQ3_S,IQ2_XXS,IQ2_XS,IQ2_S,IQ2_M,"
                 "IQ1_S,IQ1_M,TQ1_0,TQ2_0,MXFP4_FFN")

# types made with the importance matrix: llama-quantize's must-haves and the rest of IQ1-IQ3
IMATRIX_TYPES = {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "Q2_K_S",
                 "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M"}

# our names for files llama-quantize makes only with extra flags: (its type, the flags)
VARIANTS = {
    "MXFP4_FFN": ("MXFP4_MOE", ["--tensor-type", "ffn_up=mxfp4", "--tensor-type",
                                "ffn_gate=mxfp4", "--tensor-type", "ffn_down=mxfp4"]),
}


def tool(bin_dir: Path, name: str) -> list[str]:
    """The command that runs llama.cpp's ``name`` from ``bin_dir`` (its libraries beside it)."""
    exe = bin_dir / name
    if not exe.exists():
        sys.exit(f"no {name} in {bin_dir}: set --llama-bin to llama.cpp's bin folder")
    return ["env", f"LD_LIBRARY_PATH={bin_dir}", str(exe)]


def make_imatrix(bin_dir: Path, src: Path, text: Path, out: Path, threads: int) -> Path:
    """The importance matrix of ``src`` over ``text`` (made once: an existing ``out`` is kept)."""
    if out.exists():
        return out
    # NOTE: --no-repack keeps the weights out of llama.cpp's AMX buffer, whose tile instructions
    # fault where the VM does not enable them (Firecracker on Sapphire Rapids; llama.cpp issue
    # 20824); the activations llama-imatrix sums do not depend on the weights' layout.
    cmd = tool(bin_dir, "llama-imatrix") + ["-m", str(src), "-f", str(text), "-o", str(out),
                                            "-c", "512", "--chunks", "24", "-t", str(threads),
                                            "--no-repack"]
    print("$", " ".join(cmd[2:]), flush=True)
    log = out.with_suffix(".log")
    with log.open("w") as f:
        proc = subprocess.run(cmd, check=False, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        sys.exit(f"llama-imatrix failed: see {log}")
    return out


def quantize(bin_dir: Path, src: Path, out: Path, name: str, imatrix: Path | None,
             threads: int) -> bool:
    """Make ``out`` as ``name`` (a llama-quantize type or one of VARIANTS); False, with the
    tool's last lines printed, where llama-quantize refuses it."""
    ftype, extra = VARIANTS.get(name, (name, []))
    cmd = tool(bin_dir, "llama-quantize") + ["--allow-requantize", *extra]
    if imatrix is not None:
        cmd += ["--imatrix", str(imatrix)]
    cmd += [str(src), str(out), ftype, str(threads)]
    print("$", " ".join(cmd[2:]), flush=True)
    log = out.with_suffix(".log")
    with log.open("w") as f:
        proc = subprocess.run(cmd, check=False, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        out.unlink(missing_ok=True)
        print("  refused:", *log.read_text().strip().splitlines()[-4:], sep="\n    ")
    return proc.returncode == 0


def histogram(path: Path) -> list[tuple[str, int, int]]:
    """(tensor type, tensors, bytes) of a GGUF file, most bytes first."""
    import gguf

    counts: collections.Counter[str] = collections.Counter()
    sizes: collections.Counter[str] = collections.Counter()
    for t in gguf.GGUFReader(path).tensors:
        counts[t.tensor_type.name] += 1
        sizes[t.tensor_type.name] += int(t.n_bytes)
    return [(k, counts[k], n) for k, n in sizes.most_common()]


def describe(path: Path) -> str:
    """One table row: file, size in MiB, and the types' shares of the tensor bytes."""
    hist = histogram(path)
    total = sum(n for _, _, n in hist)
    parts = ", ".join(f"{k} {100 * n / total:.0f}% ({c})" for k, c, n in hist)
    return f"| {path.name} | {path.stat().st_size / 2**20:,.0f} | {parts} |"


def default_bin() -> str | None:
    if os.environ.get("LLAMA_CPP_BIN"):
        return os.environ["LLAMA_CPP_BIN"]
    server = os.environ.get("LLAMA_SERVER")
    return str(Path(server).parent) if server else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", required=True, type=Path, help="the source GGUF")
    ap.add_argument("--out-dir", required=True, type=Path)
    ap.add_argument("--types", default=DEFAULT_TYPES,
                    help=f"comma separated; ours beside llama-quantize's: {', '.join(VARIANTS)}")
    ap.add_argument("--llama-bin", default=default_bin(),
                    help="llama.cpp's bin folder (env LLAMA_CPP_BIN, else LLAMA_SERVER's folder)")
    ap.add_argument("--imatrix-text", type=Path, nargs="*",
                    help="text files for the importance matrix (default: docs/*.md)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--force", action="store_true", help="remake files already there")
    args = ap.parse_args()
    if not args.llama_bin:
        sys.exit("set --llama-bin, LLAMA_CPP_BIN or LLAMA_SERVER")
    if not args.src.is_file():
        sys.exit(f"no source GGUF {args.src}")
    bin_dir = Path(args.llama_bin)
    types = [t.strip().upper() for t in args.types.split(",") if t.strip()]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.src.stem
    imatrix = None
    if IMATRIX_TYPES & set(types):
        text = args.out_dir / f"imatrix-{stem}.txt"
        sources = args.imatrix_text or sorted((ROOT / "docs").glob("*.md"))
        text.write_text("\n\n".join(p.read_text() for p in sources))
        imatrix = make_imatrix(bin_dir, args.src, text, args.out_dir / f"imatrix-{stem}.gguf",
                               args.threads)
    made, refused = [], []
    for name in types:
        out = args.out_dir / f"{stem}-{name}.gguf"
        if args.force or not out.exists():
            use = imatrix if name in IMATRIX_TYPES else None
            if not quantize(bin_dir, args.src, out, name, use, args.threads):
                refused.append(name)
                continue
        made.append(out)
    print("\n| file | MiB | tensor bytes by type (tensors) |\n|---|---|---|")
    for out in [args.src, *made]:
        print(describe(out))
    if refused:
        print("refused by llama-quantize:", ", ".join(refused))


if __name__ == "__main__":
    main()
