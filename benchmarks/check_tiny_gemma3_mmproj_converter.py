"""Check tests/tiny_gemma3_mmproj.py's mmproj writer against llama.cpp's own converter.

The vision encoder tests write their tiny mmproj files with ``gemma3_mmproj_gguf`` (CI has no
llama.cpp); this script says whether that writer still writes what
``convert_hf_to_gguf.py FOLDER --mmproj`` (``Gemma3VisionModel``) writes: the tiny folder in
the releases' tensor layout, converted both ways at F32, F16, BF16 and Q8_0, every metadata key
(value and type) and every tensor (name, type, shape, bytes) compared; the ``general.*`` keys
the converter derives from the folder name are listed apart (check_tiny_gguf_converter.py).

    python benchmarks/check_tiny_gemma3_mmproj_converter.py [--llama-cpp DIR]

Exit status 1 on a difference.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from check_tiny_gguf_converter import WRAPPER, Case, check_cases, convert
from tiny_gemma3_mmproj import gemma3_mmproj_gguf, make_gemma3_vision_hf


def _convert(llama_cpp: Path, hf_dir: Path, out: Path, *, ftype: str) -> None:
    convert(WRAPPER, llama_cpp, hf_dir, out, ftype, "--mmproj")


def main() -> int:
    return check_cases(__doc__, "tiny-gemma3-mmproj-", [
        Case(f"gemma3-mmproj-{ftype}", "gemma3-vision", partial(make_gemma3_vision_hf, seed=0),
             partial(_convert, ftype=ftype), partial(gemma3_mmproj_gguf, ftype=ftype))
        for ftype in ("f32", "f16", "bf16", "q8_0")])


if __name__ == "__main__":
    sys.exit(main())
