"""Check tests/tiny_gemma4_gguf.py's GGUF writer against llama.cpp's own converter.

The Gemma 4 GGUF tests convert their tiny checkpoints with ``gemma4_hf_to_gguf`` (CI has no
llama.cpp); this script says whether that writer still writes what ``convert_hf_to_gguf.py``
(``Gemma4Model``) writes, as check_tiny_gguf_converter.py does for Qwen3.5 (whose converter
wrapper and comparison it reuses): for each tiny layout (E2B: per-layer inputs and shared KV;
31B: values from the keys; 26B-A4B: routed experts), F32 and Q8_0, it builds the tiny folder
with a byte-fallback tokenizer (the converter reads Gemma 4 vocabularies so), converts it both
ways and compares every metadata key and every tensor.

    python benchmarks/check_tiny_gemma4_converter.py [--llama-cpp DIR]

Exit status 1 on a difference.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from check_tiny_gguf_converter import compare
from check_tiny_lfm2_converter import run_converter
from tiny_gemma4 import KINDS, make_gemma4_hf_model
from tiny_gemma4_gguf import gemma4_hf_to_gguf, save_byte_fallback_tokenizer

OVERRIDES = {"e2b": {"hidden_size_per_layer_input": 32}}  # as tests/models/test_gemma4_gguf.py


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-cpp", type=Path, default=Path(
        os.environ.get("LLAMA_CPP_SOURCE", "/work/peers/llama.cpp")))
    args = parser.parse_args()
    if not (args.llama_cpp / "convert_hf_to_gguf.py").is_file():
        print(f"no convert_hf_to_gguf.py in {args.llama_cpp}", file=sys.stderr)
        return 2
    failed = False
    with tempfile.TemporaryDirectory(prefix="tiny-gemma4-") as tmp:
        root = Path(tmp)
        for kind in KINDS:
            hf_dir = save_byte_fallback_tokenizer(
                make_gemma4_hf_model(kind, root / kind, seed=0, **OVERRIDES.get(kind, {})))
            for ftype in ("F32", "Q8_0"):
                case = f"{kind}-{ftype}"
                ref, mine = root / f"{case}-ref.gguf", root / f"{case}.gguf"
                run_converter(args.llama_cpp, hf_dir, ref, ftype)
                gemma4_hf_to_gguf(hf_dir, mine, ftype)
                problems, notes = compare(ref, mine)
                print(f"{case}: {'OK' if not problems else f'{len(problems)} differences'}"
                      f" ({len(notes)} naming keys differ)")
                for line in problems + [f"  (naming) {n}" for n in notes]:
                    print(f"  {line}")
                failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
