"""Check tests/tiny_smolvlm.py's GGUF writers against llama.cpp's own converter.

The SmolVLM tests write their tiny text and mmproj files with ``smolvlm_text_gguf`` and
``smolvlm_mmproj_gguf`` (CI has no llama.cpp); this script says whether they still write what
``convert_hf_to_gguf.py FOLDER`` (``LlamaModel`` on the folder's ``text_config``) and
``convert_hf_to_gguf.py FOLDER --mmproj`` (``SmolVLMModel``, projector ``idefics3``) write:
the tiny folder converted both ways (text F32, F16, Q8_0; mmproj f32, f16, bf16, q8_0), every
metadata key (value and type) and every tensor (name, type, shape, bytes) compared; the
``general.*`` keys the converter derives from the folder name are listed apart
(check_tiny_gguf_converter.py).

    python benchmarks/check_tiny_smolvlm_converter.py [--llama-cpp DIR]

Exit status 1 on a difference.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from check_tiny_gguf_converter import WRAPPER, Case, check_cases, convert
from tiny_smolvlm import make_smolvlm_hf, smolvlm_mmproj_gguf, smolvlm_text_gguf


def _convert(llama_cpp: Path, hf_dir: Path, out: Path, *, ftype: str,
             mmproj: bool = False) -> None:
    convert(WRAPPER, llama_cpp, hf_dir, out, ftype, *(["--mmproj"] if mmproj else []))


def main() -> int:
    make = partial(make_smolvlm_hf, seed=0)
    text = [Case(f"smolvlm-text-{ftype}", "smolvlm", make, partial(_convert, ftype=ftype),
                 partial(smolvlm_text_gguf, ftype=ftype)) for ftype in ("F32", "F16", "Q8_0")]
    mmproj = [Case(f"smolvlm-mmproj-{ftype}", "smolvlm", make,
                   partial(_convert, ftype=ftype, mmproj=True),
                   partial(smolvlm_mmproj_gguf, ftype=ftype))
              for ftype in ("f32", "f16", "bf16", "q8_0")]
    return check_cases(__doc__, "tiny-smolvlm-", text + mmproj)


if __name__ == "__main__":
    sys.exit(main())
