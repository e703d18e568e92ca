"""Check tests/tiny_mistral3_vlm.py's GGUF writers against llama.cpp's own converter.

The Mistral 3 image tests write their tiny text and mmproj files with ``mistral3_vlm_text_gguf``
and ``mistral3_vlm_mmproj_gguf`` (CI has no llama.cpp); this script says whether they still
write what ``convert_hf_to_gguf.py FOLDER`` (``Mistral3Model``, arch ``mistral3``) and
``convert_hf_to_gguf.py FOLDER --mmproj`` (``LlavaVisionModel``, projector ``pixtral``) write:
the tiny folder converted both ways (text F32, F16, Q8_0; mmproj f32, f16, bf16, q8_0), every
metadata key (value and type) and every tensor (name, type, shape, bytes) compared; the
``general.*`` keys the converter derives from the folder name are listed apart
(check_tiny_gguf_converter.py).

    python benchmarks/check_tiny_mistral3_vlm_converter.py [--llama-cpp DIR]

Exit status 1 on a difference.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from check_tiny_gguf_converter import WRAPPER, Case, check_cases, convert
from tiny_mistral3_vlm import make_mistral3_vlm_hf, mistral3_vlm_mmproj_gguf, mistral3_vlm_text_gguf


def _convert(llama_cpp: Path, hf_dir: Path, out: Path, *, ftype: str,
             mmproj: bool = False) -> None:
    convert(WRAPPER, llama_cpp, hf_dir, out, ftype, *(["--mmproj"] if mmproj else []))


def main() -> int:
    make = partial(make_mistral3_vlm_hf, seed=0)
    text = [Case(f"mistral3vl-text-{ftype}", "mistral3vl", make, partial(_convert, ftype=ftype),
                 partial(mistral3_vlm_text_gguf, ftype=ftype)) for ftype in ("F32", "F16", "Q8_0")]
    mmproj = [Case(f"mistral3vl-mmproj-{ftype}", "mistral3vl", make,
                   partial(_convert, ftype=ftype, mmproj=True),
                   partial(mistral3_vlm_mmproj_gguf, ftype=ftype))
              for ftype in ("f32", "f16", "bf16", "q8_0")]
    return check_cases(__doc__, "tiny-mistral3vl-", text + mmproj)


if __name__ == "__main__":
    sys.exit(main())
