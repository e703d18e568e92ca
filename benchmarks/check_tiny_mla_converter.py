"""Check tests/tiny_mla.py's GGUF writer (GLM-4.7-Flash, DeepSeek-V3: llama.cpp's ``deepseek2``)
against llama.cpp's own converter.

CI has no llama.cpp source, so the tests convert the tiny checkpoints with ``mla_hf_to_gguf``;
this script says whether that writer still writes what ``convert_hf_to_gguf.py``
(``Glm4MoeLiteModel``, ``DeepseekV2Model``) writes. For each case (each model; F32, F16, Q8_0)
it builds the tiny folder, converts it both ways and compares every metadata key (value and
type) and every tensor (name, type, shape, bytes), as benchmarks/check_tiny_gguf_converter.py
does (whose comparison and converter wrapper this reuses; the ``general.*`` naming keys are
listed apart). ``Glm4MoeLiteModel`` reads GLM's own tokenizer (``[gMASK]`` and the like),
which the tiny one has not: its vocabulary is written as DeepseekV2Model's ``gpt2`` one
here, as it is for DeepSeek-V3 (the tokenizer keys are not what this checks).

    python benchmarks/check_tiny_mla_converter.py [--llama-cpp DIR]

Exit status 1 on a difference.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from check_tiny_gguf_converter import WRAPPER, Case, check_cases, convert
from tiny_mla import KINDS, make_mla_hf_model, mla_hf_to_gguf

FTYPES = ("F32", "F16", "Q8_0")
_GLM_VOCAB = ("import conversion.glm as glm\n"
              "glm.Glm4MoeLiteModel.set_vocab = lambda self: self._set_vocab_gpt2()\n")
MLA_WRAPPER = WRAPPER.replace('sys.argv[0] = src', _GLM_VOCAB + 'sys.argv[0] = src')


def _convert(llama_cpp: Path, hf_dir: Path, out: Path, *, ftype: str) -> None:
    convert(MLA_WRAPPER, llama_cpp, hf_dir, out, ftype)


def main() -> int:
    return check_cases(__doc__, "tiny-mla-", [
        Case(f"{kind}-{ftype}", kind, partial(make_mla_hf_model, kind, seed=0),
             partial(_convert, ftype=ftype), partial(mla_hf_to_gguf, ftype=ftype))
        for kind in KINDS for ftype in FTYPES])


if __name__ == "__main__":
    sys.exit(main())
