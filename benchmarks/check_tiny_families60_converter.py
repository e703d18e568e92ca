"""Check tests/tiny_families60.py's GGUF writer (SmolLM3, OLMo 2, OLMo 3, Ministral 3) against
llama.cpp's own converter.

CI has no llama.cpp source, so the tests convert the tiny checkpoints with
``family_hf_to_gguf``; this script says whether that writer still writes what
``convert_hf_to_gguf.py`` writes. For each case (each family; SmolLM3 untied too; F32, F16,
Q8_0) it builds the tiny folder, converts it both ways and compares every metadata key (value
and type) and every tensor (name, type, shape, bytes), as benchmarks/check_tiny_gguf_converter.py
does (whose comparison and converter wrapper this reuses; the ``general.*`` naming keys are
listed apart).

    python benchmarks/check_tiny_families60_converter.py [--llama-cpp DIR]

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
from tiny_families60 import family_hf_to_gguf, make_family_hf_model

CASES = (  # (label, kind, overrides, ftype)
    ("smollm3", "smollm3", {}, "F32"),
    ("smollm3", "smollm3", {}, "Q8_0"),
    ("smollm3-untied", "smollm3", {"tie_word_embeddings": False}, "F16"),
    ("olmo2", "olmo2", {}, "F32"),
    ("olmo2", "olmo2", {}, "Q8_0"),
    ("olmo3", "olmo3", {}, "F32"),
    ("olmo3", "olmo3", {}, "F16"),
    ("olmo3", "olmo3", {}, "Q8_0"),
    ("mistral3", "mistral3", {}, "F32"),
    ("mistral3", "mistral3", {}, "Q8_0"),
)


def run_converter(llama_cpp: Path, hf_dir: Path, out: Path, ftype: str) -> None:
    """The converter on ``hf_dir`` (no ``--no-mtp``: these architectures refuse the flag)."""
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
    with tempfile.TemporaryDirectory(prefix="tiny-families60-") as tmp:
        root = Path(tmp)
        for label, kind, overrides, ftype in CASES:
            hf_dir = root / label
            if not (hf_dir / "config.json").exists():
                make_family_hf_model(kind, hf_dir, seed=0, **overrides)
            case = f"{label}-{ftype}"
            ref, mine = root / f"{case}-ref.gguf", root / f"{case}.gguf"
            run_converter(args.llama_cpp, hf_dir, ref, ftype)
            family_hf_to_gguf(hf_dir, mine, ftype)
            problems, notes = compare(ref, mine)
            print(f"{case}: {'OK' if not problems else f'{len(problems)} differences'}"
                  f" ({len(notes)} naming keys differ)")
            for line in problems + [f"  (naming) {n}" for n in notes]:
                print(f"  {line}")
            failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
