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

import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from check_tiny_gguf_converter import WRAPPER, Case, check_cases, convert
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


def _convert(llama_cpp: Path, hf_dir: Path, out: Path, *, ftype: str) -> None:
    convert(WRAPPER, llama_cpp, hf_dir, out, ftype)


def main() -> int:
    cases = []
    for kind, overrides, ftype in CASES:
        label = kind + ("-tied" if overrides else "")
        cases.append(Case(f"{label}-{ftype}", label,
                          partial(make_granite_hf_model, kind, seed=0, **overrides),
                          partial(_convert, ftype=ftype), partial(granite_hf_to_gguf, ftype=ftype)))
    return check_cases(__doc__, "tiny-granite-", cases)


if __name__ == "__main__":
    sys.exit(main())
