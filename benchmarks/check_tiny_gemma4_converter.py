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

import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from check_tiny_gguf_converter import WRAPPER, Case, check_cases, convert
from tiny_gemma4 import KINDS, make_gemma4_hf_model
from tiny_gemma4_gguf import gemma4_hf_to_gguf, save_byte_fallback_tokenizer

OVERRIDES = {"e2b": {"hidden_size_per_layer_input": 32}}  # as tests/models/test_gemma4_gguf.py


def _convert(llama_cpp: Path, hf_dir: Path, out: Path, *, ftype: str) -> None:
    convert(WRAPPER, llama_cpp, hf_dir, out, ftype)


def _make(hf_dir: Path, *, kind: str) -> None:
    make_gemma4_hf_model(kind, hf_dir, seed=0, **OVERRIDES.get(kind, {}))
    save_byte_fallback_tokenizer(hf_dir)


def main() -> int:
    return check_cases(__doc__, "tiny-gemma4-", [
        Case(f"{kind}-{ftype}", kind, partial(_make, kind=kind),
             partial(_convert, ftype=ftype), partial(gemma4_hf_to_gguf, ftype=ftype))
        for kind in KINDS for ftype in ("F32", "Q8_0")])


if __name__ == "__main__":
    sys.exit(main())
