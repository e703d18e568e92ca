"""Check tests/tiny_gpt_oss.py's GGUF writer against llama.cpp's own converter.

CI has no llama.cpp source, so the tests convert the tiny gpt-oss checkpoints with
``gpt_oss_hf_to_gguf``; this script says whether that writer still writes what
``convert_hf_to_gguf.py`` (``GptOssModel``, conversion/gpt_oss.py) writes from a float folder.
For F32, F16 and Q8_0 it builds the tiny folder, converts it both ways and compares every
metadata key (value and type) and every tensor (name, type, shape, bytes), as
benchmarks/check_tiny_gguf_converter.py does (its ``compare``). The MXFP4 experts of the
released files come from folders that store them in MXFP4 (``*_blocks`` / ``*_scales``),
which the tiny folder does not: the tests quantize the float experts with gguf-py instead.

    python benchmarks/check_tiny_gpt_oss_converter.py [--llama-cpp DIR]

``DIR`` (default: ``$LLAMA_CPP_SOURCE``, else /work/peers/llama.cpp) is a llama.cpp checkout;
the converter runs with this interpreter and the checkout's own gguf-py, the tiny tokenizer's
pre-tokenizer named "qwen2" (the converter cannot recognize it by hash) and the
hyperparameters read from config.json as it is. Exit status 1 on a difference.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from check_tiny_gguf_converter import Case, check_cases, convert  # this directory's
from tiny_gpt_oss import gpt_oss_hf_to_gguf, make_gpt_oss_hf_model

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
CASES = ("F32", "F16", "Q8_0")


def _convert(llama_cpp: Path, hf_dir: Path, out: Path, *, ftype: str) -> None:
    convert(WRAPPER, llama_cpp, hf_dir, out, ftype)


def main() -> int:
    return check_cases(__doc__, "tiny-gpt-oss-", [
        Case(ftype, "tiny-gpt-oss", partial(make_gpt_oss_hf_model, seed=0),
             partial(_convert, ftype=ftype), partial(gpt_oss_hf_to_gguf, ftype=ftype))
        for ftype in CASES])


if __name__ == "__main__":
    sys.exit(main())
