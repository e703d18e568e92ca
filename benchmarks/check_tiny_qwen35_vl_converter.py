"""Check tests/tiny_qwen35_vl.py's GGUF writers against llama.cpp's own converter.

The Qwen3.5 vision tests write the tiny folder's files with tests/tiny_hybrid.py's
``qwen35_hf_to_gguf`` (the text model, its ``qwen35.rope.dimension_sections`` included) and
``qwen35_vl_mmproj_gguf`` (CI has no llama.cpp); this script says whether they still write what
``convert_hf_to_gguf.py FOLDER`` (``Qwen3_5TextModel``, ``--no-mtp``) and
``convert_hf_to_gguf.py FOLDER --mmproj`` (``Qwen3VLVisionModel``, projector
``qwen3vl_merger``) write: the tiny folder converted both ways (text F32, F16; mmproj f32, f16,
bf16, q8_0), every metadata key (value and type) and every tensor (name, type, shape, bytes)
compared; the ``general.*`` keys the converter derives from the folder name are listed apart
(check_tiny_gguf_converter.py).

    python benchmarks/check_tiny_qwen35_vl_converter.py [--llama-cpp DIR]

Exit status 1 on a difference.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from check_tiny_gguf_converter import WRAPPER, Case, check_cases, convert, run_converter
from tiny_hybrid import qwen35_hf_to_gguf
from tiny_qwen35_vl import make_qwen35_vl_hf, qwen35_vl_mmproj_gguf


def _convert_mmproj(llama_cpp: Path, hf_dir: Path, out: Path, *, ftype: str) -> None:
    convert(WRAPPER, llama_cpp, hf_dir, out, ftype, "--mmproj")


def main() -> int:
    make = partial(make_qwen35_vl_hf, seed=0)
    text = [Case(f"qwen35-vl-text-{ftype}", "qwen35-vl", make,
                 partial(run_converter, ftype=ftype, mtp=False),
                 partial(qwen35_hf_to_gguf, ftype=ftype)) for ftype in ("F32", "F16")]
    mmproj = [Case(f"qwen35-vl-mmproj-{ftype}", "qwen35-vl", make,
                   partial(_convert_mmproj, ftype=ftype),
                   partial(qwen35_vl_mmproj_gguf, ftype=ftype))
              for ftype in ("f32", "f16", "bf16", "q8_0")]
    return check_cases(__doc__, "tiny-qwen35-vl-", text + mmproj)


if __name__ == "__main__":
    sys.exit(main())
