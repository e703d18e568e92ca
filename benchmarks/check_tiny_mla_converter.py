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

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from check_tiny_gguf_converter import _WRAPPER, compare
from tiny_mla import KINDS, make_mla_hf_model, mla_hf_to_gguf

FTYPES = ("F32", "F16", "Q8_0")
_GLM_VOCAB = ("import conversion.glm as glm\n"
              "glm.Glm4MoeLiteModel.set_vocab = lambda self: self._set_vocab_gpt2()\n")
_MLA_WRAPPER = _WRAPPER.replace('sys.argv[0] = src', _GLM_VOCAB + 'sys.argv[0] = src')


def run_converter(llama_cpp: Path, hf_dir: Path, out: Path, ftype: str) -> None:
    args = [sys.executable, "-c", _MLA_WRAPPER, str(llama_cpp), str(hf_dir), "--outfile",
            str(out), "--outtype", ftype.lower()]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{done.stderr[-3000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-cpp", type=Path, default=Path(
        os.environ.get("LLAMA_CPP_SOURCE", "/work/peers/llama.cpp")))
    args = parser.parse_args()
    if not (args.llama_cpp / "convert_hf_to_gguf.py").is_file():
        print(f"no convert_hf_to_gguf.py in {args.llama_cpp}", file=sys.stderr)
        return 2
    failed = False
    with tempfile.TemporaryDirectory(prefix="tiny-mla-") as tmp:
        root = Path(tmp)
        for kind in KINDS:
            hf_dir = make_mla_hf_model(kind, root / kind, seed=0)
            for ftype in FTYPES:
                case = f"{kind}-{ftype}"
                ref, mine = root / f"{case}-ref.gguf", root / f"{case}.gguf"
                run_converter(args.llama_cpp, hf_dir, ref, ftype)
                mla_hf_to_gguf(hf_dir, mine, ftype)
                problems, notes = compare(ref, mine)
                print(f"{case}: {'OK' if not problems else f'{len(problems)} differences'}"
                      f" ({len(notes)} naming keys differ)")
                for line in problems + [f"  (naming) {n}" for n in notes]:
                    print(f"  {line}")
                failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
