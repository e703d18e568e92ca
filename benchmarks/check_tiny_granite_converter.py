"""Check tests/tiny_granite.py's GGUF writer against llama.cpp's own converter.

CI has no llama.cpp source, so the tests convert the tiny Granite checkpoints with
``granite_hf_to_gguf``; this script says whether that writer still writes what
``convert_hf_to_gguf.py`` writes. For each case (dense Granite, GraniteMoe with and without
the shared MLP, the Granite 4.0-H hybrids dense and MoE, a tied head; F32, F16, Q8_0) it builds
the tiny folder, converts it both ways and compares every metadata key (value and type) and
every tensor (name, type, shape, bytes), as benchmarks/check_tiny_gguf_converter.py does (the
``general.*`` naming keys listed apart).

    python benchmarks/check_tiny_granite_converter.py [--llama-cpp DIR]

``DIR`` (default: ``$LLAMA_CPP_SOURCE``, else /work/peers/llama.cpp) is a llama.cpp checkout.
Exit status 1 on a difference.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from check_tiny_gguf_converter import _WRAPPER, compare
from tiny_granite import granite_hf_to_gguf, make_granite_hf_model

CASES = (  # (kind, its config overrides, ftype)
    ("granite", {}, "F32"),
    ("granite", {"tie_word_embeddings": True}, "Q8_0"),
    ("granitemoe", {}, "F32"),
    ("granitemoeshared", {}, "Q8_0"),
    ("hybrid", {}, "F32"),
    ("hybrid", {}, "F16"),
    ("hybrid", {}, "Q8_0"),
    ("hybrid-moe", {}, "F32"),
    ("hybrid-moe", {"tie_word_embeddings": True}, "Q8_0"),
)


def run_converter(llama_cpp: Path, hf_dir: Path, out: Path, ftype: str) -> None:
    args = [sys.executable, "-c", _WRAPPER, str(llama_cpp), str(hf_dir), "--outfile", str(out),
            "--outtype", ftype.lower()]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{done.stderr[-3000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-cpp", type=Path, default=Path(
        os.environ.get("LLAMA_CPP_SOURCE", "/work/peers/llama.cpp")))
    args = parser.parse_args()
    if not (args.llama_cpp / "convert_hf_to_gguf.py").is_file():
        print(f"no convert_hf_to_gguf.py in {args.llama_cpp}", file=sys.stderr)
        return 2
    failed = False
    with tempfile.TemporaryDirectory(prefix="tiny-granite-") as tmp:
        root = Path(tmp)
        for kind, overrides, ftype in CASES:
            label = kind + ("-tied" if overrides else "")
            hf_dir = root / label
            if not (hf_dir / "config.json").exists():
                make_granite_hf_model(kind, hf_dir, seed=0, **overrides)
            ref, mine = root / f"{label}-{ftype}-ref.gguf", root / f"{label}-{ftype}.gguf"
            run_converter(args.llama_cpp, hf_dir, ref, ftype)
            granite_hf_to_gguf(hf_dir, mine, ftype)
            problems, notes = compare(ref, mine)
            print(f"{label}-{ftype}: {'OK' if not problems else f'{len(problems)} differences'}"
                  f" ({len(notes)} naming keys differ)")
            for line in problems + [f"  (naming) {n}" for n in notes]:
                print(f"  {line}")
            failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
