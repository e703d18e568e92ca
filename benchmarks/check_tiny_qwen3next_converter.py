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

import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from check_tiny_gguf_converter import Case, check_cases, run_converter
from tiny_qwen3next import make_qwen3next_hf_model, qwen3next_hf_to_gguf

CASES = (  # (label, the maker's keywords, ftype)
    ("plain", {}, "F32"),
    ("plain", {}, "F16"),
    ("plain", {}, "Q8_0"),
    ("tied", {"tie_word_embeddings": True}, "Q8_0"),
    ("mtp", {"mtp": True}, "F32"),
    ("mtp", {"mtp": True}, "Q8_0"),
)


def _convert(llama_cpp: Path, hf_dir: Path, out: Path, *, ftype: str, mtp: bool) -> None:
    run_converter(llama_cpp, hf_dir, out, ftype, mtp)


def main() -> int:
    return check_cases(__doc__, "tiny-qwen3next-", [
        Case(f"{label}-{ftype}", label, partial(make_qwen3next_hf_model, seed=0, **kwargs),
             partial(_convert, ftype=ftype, mtp=kwargs.get("mtp", False)),
             partial(qwen3next_hf_to_gguf, ftype=ftype))
        for label, kwargs, ftype in CASES])


if __name__ == "__main__":
    sys.exit(main())
