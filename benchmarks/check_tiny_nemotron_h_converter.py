"""Check tests/tiny_nemotron_h.py's GGUF writer against llama.cpp's own converter.

CI has no llama.cpp source, so the tests convert the tiny Nemotron-H checkpoints with
``nemotron_h_hf_to_gguf``; this script says whether that writer still writes what
``convert_hf_to_gguf.py`` writes. For each case (dense ``nemotron_h``; the MoE
``nemotron_h_moe``; F32, F16, Q8_0) it builds the tiny folder, converts it both ways and
compares every metadata key (value and type) and every tensor (name, type, shape, bytes), as
benchmarks/check_tiny_gguf_converter.py does (its ``compare``).

    python benchmarks/check_tiny_nemotron_h_converter.py [--llama-cpp DIR]

``DIR`` (default: ``$LLAMA_CPP_SOURCE``, else /work/peers/llama.cpp) is a llama.cpp checkout;
the converter runs with this interpreter and the checkout's own gguf-py. Two things are set
for it: the tiny tokenizer's pre-tokenizer is named "qwen2" (the converter cannot recognize it
by hash), and the hyperparameters are config.json as it is (transformers' ``AutoConfig`` is
kept from it). With a transformers that knows ``nemotron_h`` the converter would read
``AutoConfig(...).to_dict()``, which lists the MoE keys for every model (so a dense model
converts as ``nemotron_h_moe`` with zero MLP widths) and no ``num_hidden_layers``; the
published GGUF files were converted from config.json. Exit status 1 on a difference.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from check_tiny_gguf_converter import Case, check_cases, convert  # this directory's
from tiny_nemotron_h import make_nemotron_h_hf_model, nemotron_h_hf_to_gguf

# runs the converter as __main__, its gguf-py first on the path, the pre-tokenizer named and
# the hyperparameters read from config.json as they are
WRAPPER = """
import runpy, sys
src = sys.argv.pop(1)
sys.path[:0] = [src, src + "/gguf-py"]
import conversion.base as base
import transformers
def _config_json(*args, **kwargs):
    raise ValueError("read config.json as it is")
transformers.AutoConfig.from_pretrained = _config_json
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
sys.argv[0] = src + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""
CASES = (  # (label, its keywords, ftype)
    ("dense", {}, "F32"),
    ("dense", {}, "F16"),
    ("dense", {}, "Q8_0"),
    ("moe", {"moe": True}, "F32"),
    ("moe", {"moe": True}, "Q8_0"),
)


def _convert(llama_cpp: Path, hf_dir: Path, out: Path, *, ftype: str) -> None:
    convert(WRAPPER, llama_cpp, hf_dir, out, ftype, "--no-mtp")


def main() -> int:
    return check_cases(__doc__, "tiny-nemotron-h-", [
        Case(f"{label}-{ftype}", label, partial(make_nemotron_h_hf_model, seed=0, **kwargs),
             partial(_convert, ftype=ftype), partial(nemotron_h_hf_to_gguf, ftype=ftype))
        for label, kwargs, ftype in CASES])


if __name__ == "__main__":
    sys.exit(main())
