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

import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from check_tiny_gguf_converter import WRAPPER, Case, check_cases, convert
from tiny_lfm2 import lfm2_hf_to_gguf, make_lfm2_hf_model, make_lfm2_moe_hf_model

DENSE, MOE = make_lfm2_hf_model, make_lfm2_moe_hf_model
CASES = (  # (label, maker, its keywords, ftype)
    ("tied", DENSE, {}, "F32"),
    ("tied", DENSE, {}, "Q8_0"),
    ("untied", DENSE, {"tie_word_embeddings": False}, "F16"),
    ("moe", MOE, {}, "F32"),
    ("moe", MOE, {}, "Q8_0"),
)


def _convert(llama_cpp: Path, hf_dir: Path, out: Path, *, ftype: str) -> None:
    """No ``--no-mtp``: the LFM2 models refuse the MTP flags."""
    convert(WRAPPER, llama_cpp, hf_dir, out, ftype)


def main() -> int:
    return check_cases(__doc__, "tiny-lfm2-", [
        Case(f"{label}-{ftype}", label, partial(maker, seed=0, **kwargs),
             partial(_convert, ftype=ftype), partial(lfm2_hf_to_gguf, ftype=ftype))
        for label, maker, kwargs, ftype in CASES])


if __name__ == "__main__":
    sys.exit(main())
