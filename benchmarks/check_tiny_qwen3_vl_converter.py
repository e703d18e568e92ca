"""Check tests/tiny_qwen3_vl.py's GGUF writers against llama.cpp's own converter.

The Qwen3-VL tests write the tiny folder's files with ``qwen3_vl_text_gguf`` (the text model:
arch ``qwen3vl``, its ``rope.dimension_sections`` and ``n_deepstack_layers``) and
``qwen3_vl_mmproj_gguf`` (the tower with its deepstack mergers; CI has no llama.cpp); this
script says whether they still write what ``convert_hf_to_gguf.py FOLDER``
(``Qwen3VLTextModel``) and ``convert_hf_to_gguf.py FOLDER --mmproj`` (``Qwen3VLVisionModel``,
projector ``qwen3vl_merger``) write: the tiny folder converted both ways (text F32, F16, Q8_0,
a tied head F16; mmproj f32, f16, bf16, q8_0), every metadata key (value and type) and every
tensor (name, type, shape, bytes) compared; the ``general.*`` keys the converter derives from
the folder name are listed apart (check_tiny_gguf_converter.py).

    python benchmarks/check_tiny_qwen3_vl_converter.py [--llama-cpp DIR]

Exit status 1 on a difference.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from check_tiny_gguf_converter import WRAPPER, Case, check_cases, convert
from tiny_qwen3_vl import make_qwen3_vl_hf, qwen3_vl_mmproj_gguf, qwen3_vl_text_gguf


def _convert(llama_cpp: Path, hf_dir: Path, out: Path, *, ftype: str,
             mmproj: bool = False) -> None:
    convert(WRAPPER, llama_cpp, hf_dir, out, ftype, *(["--mmproj"] if mmproj else []))


def main() -> int:
    make = partial(make_qwen3_vl_hf, seed=0)
    tied = partial(make_qwen3_vl_hf, seed=0, tie_word_embeddings=True)
    text = [Case(f"qwen3vl-text-{ftype}", "qwen3vl", make, partial(_convert, ftype=ftype),
                 partial(qwen3_vl_text_gguf, ftype=ftype)) for ftype in ("F32", "F16", "Q8_0")]
    text.append(Case("qwen3vl-tied-text-F16", "qwen3vl-tied", tied,
                     partial(_convert, ftype="F16"), partial(qwen3_vl_text_gguf, ftype="F16")))
    mmproj = [Case(f"qwen3vl-mmproj-{ftype}", "qwen3vl", make,
                   partial(_convert, ftype=ftype, mmproj=True),
                   partial(qwen3_vl_mmproj_gguf, ftype=ftype))
              for ftype in ("f32", "f16", "bf16", "q8_0")]
    return check_cases(__doc__, "tiny-qwen3vl-", text + mmproj)


if __name__ == "__main__":
    sys.exit(main())
