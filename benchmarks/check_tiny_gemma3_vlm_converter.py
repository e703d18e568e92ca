"""Check tests/tiny_gemma3_vlm.py's text GGUF writer against llama.cpp's own converter.

The Gemma 3 vision tests convert their tiny ``Gemma3ForConditionalGeneration`` folder with
``gemma3_vlm_text_gguf`` (CI has no llama.cpp); this script says whether that writer still
writes what ``convert_hf_to_gguf.py`` (``Gemma3Model``, the text half of such a folder) writes,
as check_tiny_gguf_converter.py does for Qwen3.5 (whose converter wrapper and comparison it
reuses): the tiny folder at F32, F16 and Q8_0, every metadata key and every tensor compared.

    python benchmarks/check_tiny_gemma3_vlm_converter.py [--llama-cpp DIR]

Exit status 1 on a difference.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from check_tiny_gguf_converter import WRAPPER, Case, check_cases, convert
from tiny_gemma3_vlm import gemma3_vlm_text_gguf, make_gemma3_vlm_hf


def _convert(llama_cpp: Path, hf_dir: Path, out: Path, *, ftype: str) -> None:
    convert(WRAPPER, llama_cpp, hf_dir, out, ftype)


def main() -> int:
    return check_cases(__doc__, "tiny-gemma3-vlm-", [
        Case(f"gemma3-vlm-{ftype}", "gemma3-vlm", partial(make_gemma3_vlm_hf, seed=0),
             partial(_convert, ftype=ftype), partial(gemma3_vlm_text_gguf, ftype=ftype))
        for ftype in ("F32", "F16", "Q8_0")])


if __name__ == "__main__":
    sys.exit(main())
