"""Check tests/tiny_lfm2.py's GGUF writer against llama.cpp's own converter.

The LFM2 tests convert their tiny checkpoints with ``lfm2_hf_to_gguf`` (CI has no llama.cpp);
this script says whether that writer still writes what ``convert_hf_to_gguf.py`` writes, as
check_tiny_gguf_converter.py does for Qwen3.5 (whose converter wrapper and comparison it
reuses): for each case (LFM2 tied and untied, LFM2-MoE; F32, F16, Q8_0) it builds the tiny
folder, converts it both ways and compares every metadata key and every tensor.

    python benchmarks/check_tiny_lfm2_converter.py [--llama-cpp DIR]

Exit status 1 on a difference.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from check_tiny_gguf_converter import _WRAPPER, compare
from tiny_lfm2 import lfm2_hf_to_gguf, make_lfm2_hf_model, make_lfm2_moe_hf_model

DENSE, MOE = make_lfm2_hf_model, make_lfm2_moe_hf_model
CASES = (  # (label, maker, its keywords, ftype)
    ("tied", DENSE, {}, "F32"),
    ("tied", DENSE, {}, "Q8_0"),
    ("untied", DENSE, {"tie_word_embeddings": False}, "F16"),
    ("moe", MOE, {}, "F32"),
    ("moe", MOE, {}, "Q8_0"),
)


def run_converter(llama_cpp: Path, hf_dir: Path, out: Path, ftype: str) -> None:
    """convert_hf_to_gguf.py through the Qwen3.5 check's wrapper (no ``--no-mtp``: the LFM2
    models refuse the MTP flags)."""
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
    with tempfile.TemporaryDirectory(prefix="tiny-lfm2-") as tmp:
        root = Path(tmp)
        for label, maker, kwargs, ftype in CASES:
            hf_dir = root / label
            if not (hf_dir / "config.json").exists():
                maker(hf_dir, seed=0, **kwargs)
            case = f"{label}-{ftype}"
            ref, mine = root / f"{case}-ref.gguf", root / f"{case}.gguf"
            run_converter(args.llama_cpp, hf_dir, ref, ftype)
            lfm2_hf_to_gguf(hf_dir, mine, ftype)
            problems, notes = compare(ref, mine)
            print(f"{case}: {'OK' if not problems else f'{len(problems)} differences'}"
                  f" ({len(notes)} naming keys differ)")
            for line in problems + [f"  (naming) {n}" for n in notes]:
                print(f"  {line}")
            failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
