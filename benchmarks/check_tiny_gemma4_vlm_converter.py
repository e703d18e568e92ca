"""Check tests/tiny_gemma4_vlm.py's GGUF writers against llama.cpp's own converter.

The Gemma 4 vision tests write the tiny folder's files with ``gemma4_vlm_text_gguf`` (the text
model: tests/tiny_gemma4_gguf.py's writer over ``model.language_model.*``) and
``gemma4_vlm_mmproj_gguf`` (CI has no llama.cpp); this script says whether they still write
what ``convert_hf_to_gguf.py FOLDER`` (``Gemma4Model``) and ``convert_hf_to_gguf.py FOLDER
--mmproj`` (``Gemma4VisionAudioModel``, projector ``gemma4v``) write: the tiny folder (plain,
and with clipped linears and standardized rows) converted both ways (text F32, Q8_0; mmproj
f32, f16, bf16, q8_0), every metadata key (value and type) and every tensor (name, type, shape,
bytes) compared; the ``general.*`` keys the converter derives from the folder name are listed
apart (check_tiny_gguf_converter.py).

    python benchmarks/check_tiny_gemma4_vlm_converter.py [--llama-cpp DIR]

Exit status 1 on a difference.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from check_tiny_gguf_converter import WRAPPER, Case, check_cases, convert
from tiny_gemma4_vlm import gemma4_vlm_mmproj_gguf, gemma4_vlm_text_gguf, make_gemma4_vlm_hf


def _convert(llama_cpp: Path, hf_dir: Path, out: Path, *, ftype: str,
             extra: tuple[str, ...] = ()) -> None:
    convert(WRAPPER, llama_cpp, hf_dir, out, ftype, *extra)


def main() -> int:
    plain = partial(make_gemma4_vlm_hf, seed=0)
    clipped = partial(make_gemma4_vlm_hf, seed=0, clipped=True, standardize=True)
    text = [Case(f"gemma4-vlm-text-{ftype}", "gemma4-vlm", plain,
                 partial(_convert, ftype=ftype), partial(gemma4_vlm_text_gguf, ftype=ftype))
            for ftype in ("F32", "Q8_0")]
    mmproj = [Case(f"gemma4-vlm-mmproj-{label}-{ftype}", folder, make,
                   partial(_convert, ftype=ftype, extra=("--mmproj",)),
                   partial(gemma4_vlm_mmproj_gguf, ftype=ftype))
              for label, folder, make in (("plain", "gemma4-vlm", plain),
                                          ("clipped", "gemma4-vlm-clipped", clipped))
              for ftype in ("f32", "f16", "bf16", "q8_0")]
    return check_cases(__doc__, "tiny-gemma4-vlm-", text + mmproj)


if __name__ == "__main__":
    sys.exit(main())
