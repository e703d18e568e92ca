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

import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from check_tiny_gguf_converter import WRAPPER, Case, check_cases, convert
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


def _convert(llama_cpp: Path, hf_dir: Path, out: Path, *, ftype: str) -> None:
    """No ``--no-mtp``: these architectures refuse the flag."""
    convert(WRAPPER, llama_cpp, hf_dir, out, ftype)


def main() -> int:
    return check_cases(__doc__, "tiny-families60-", [
        Case(f"{label}-{ftype}", label, partial(make_family_hf_model, kind, seed=0, **overrides),
             partial(_convert, ftype=ftype), partial(family_hf_to_gguf, ftype=ftype))
        for label, kind, overrides, ftype in CASES])


if __name__ == "__main__":
    sys.exit(main())
