"""Check tests/tiny_qwen3next.py's GGUF writer against llama.cpp's own converter.

CI has no llama.cpp source, so the tests convert the tiny Qwen3-Next checkpoints with
``qwen3next_hf_to_gguf``; this script says whether that writer still writes what
``convert_hf_to_gguf.py`` (``Qwen3NextModel``) writes. For each case (plain, tied, with an MTP
block; F32, F16, Q8_0) it builds the tiny folder, converts it both ways and compares every
metadata key (value and type) and every tensor (name, type, shape, bytes), as
check_tiny_gguf_converter.py does for Qwen3.5 (whose converter wrapper and comparison it
reuses). The writer's ``legacy`` files (``ssm_in``) are what the converter wrote before it split
``in_proj_qkvz``; today's converter cannot make them, so they are not compared.

    python benchmarks/check_tiny_qwen3next_converter.py [--llama-cpp DIR]

Exit status 1 on a difference, 2 without a llama.cpp checkout.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from check_tiny_gguf_converter import compare, run_converter
from tiny_qwen3next import make_qwen3next_hf_model, qwen3next_hf_to_gguf

CASES = (  # (label, the maker's keywords, ftype)
    ("plain", {}, "F32"),
    ("plain", {}, "F16"),
    ("plain", {}, "Q8_0"),
    ("tied", {"tie_word_embeddings": True}, "Q8_0"),
    ("mtp", {"mtp": True}, "F32"),
    ("mtp", {"mtp": True}, "Q8_0"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-cpp", type=Path, default=Path(
        os.environ.get("LLAMA_CPP_SOURCE", "/work/peers/llama.cpp")))
    args = parser.parse_args()
    if not (args.llama_cpp / "convert_hf_to_gguf.py").is_file():
        print(f"no convert_hf_to_gguf.py in {args.llama_cpp}", file=sys.stderr)
        return 2
    failed = False
    with tempfile.TemporaryDirectory(prefix="tiny-qwen3next-") as tmp:
        root = Path(tmp)
        for label, kwargs, ftype in CASES:
            hf_dir = root / label
            if not (hf_dir / "config.json").exists():
                make_qwen3next_hf_model(hf_dir, seed=0, **kwargs)
            case = f"{label}-{ftype}"
            ref, mine = root / f"{case}-ref.gguf", root / f"{case}.gguf"
            run_converter(args.llama_cpp, hf_dir, ref, ftype, kwargs.get("mtp", False))
            qwen3next_hf_to_gguf(hf_dir, mine, ftype)
            problems, notes = compare(ref, mine)
            print(f"{case}: {'OK' if not problems else f'{len(problems)} differences'}"
                  f" ({len(notes)} naming keys differ)")
            for line in problems + [f"  (naming) {n}" for n in notes]:
                print(f"  {line}")
            failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
