"""Write a random-weight vision model at a real size, as users run it: the text GGUF
(benchmarks/make_gguf.py's shape and recipe, its vocabulary given the family's special tokens
at their real ids and the release's chat template) and llama.cpp's mmproj GGUF (F16, as
``convert_hf_to_gguf.py --mmproj`` writes it by default), for speed
(benchmarks/image_side_by_side.py), not quality. Shapes:

* ``gemma-3-4b``: a SigLIP-so400m tower at 896 px with Gemma 3's projector
  (tests/tiny_gemma3_mmproj.py's writer: F16 matrices, F32 embeddings);
* ``qwen2.5-vl-3b``: Qwen2.5-VL-3B-Instruct's ViT (transformers' class at the release's size:
  depth 32, hidden 1280, window attention, merger to 2048) as a ``qwen2.5vl_merger`` mmproj
  (tests/tiny_qwen25_vl.py's writer) beside the ``qwen2vl`` text GGUF (mRoPE [16, 24, 24, 0]).

    .venv/bin/python benchmarks/make_vision_gguf.py --out /tmp/g3v     # ~4 min, ~3.2 GB
    .venv/bin/python benchmarks/make_vision_gguf.py --shape qwen2.5-vl-3b --out /tmp/q25v
    # ~70 s, 1.93 GB text + 1.34 GB mmproj; ~2.6 GB of float32 tower in RAM and on disk
    # (a temporary folder beside --out, deleted) while the mmproj is written
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import make_gguf  # noqa: E402

# Gemma 3's image tokens at their ids in the released vocabulary (262,208 entries)
IMAGE_TOKENS = {255999: "<start_of_image>", 256000: "<end_of_image>",
                262144: "<image_soft_token>"}
# Qwen2.5's special tokens at their ids in the released vocabulary (151,936 entries)
QWEN_TOKENS = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>",
               151652: "<|vision_start|>", 151653: "<|vision_end|>", 151654: "<|vision_pad|>",
               151655: "<|image_pad|>", 151656: "<|video_pad|>"}
_CONTROL = 3  # llama.cpp's token type for special tokens
_NORMAL, _UNUSED = 1, 5  # ... for a text piece, and for a slot no text produces
TEMPLATE = Path(__file__).resolve().parents[1] / "tests/chat_templates/google-gemma-3-4b-it.jinja"
SIGLIP_896 = {"image_size": 896, "patch_size": 14, "hidden_size": 1152,
              "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
              "vision_use_head": False, "layer_norm_eps": 1e-6}
PREPROCESSOR = {"do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None,
                "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
                "image_processor_type": "Gemma3ImageProcessor", "image_seq_length": 256,
                "image_std": [0.5, 0.5, 0.5], "processor_class": "Gemma3Processor",
                "resample": 2, "rescale_factor": 1 / 255, "size": {"height": 896, "width": 896}}


def text_gguf(shape: str, recipe: str, out: Path) -> Path:
    """make_gguf's file with the family's special tokens, token ids and chat template."""
    family = FAMILIES[shape]
    plain = make_gguf.copy_tokenizer
    names = set(family.tokens.values())

    def vocabulary(value: list) -> list:
        # the embedded tokenizer's own copy of a moved special (SmolLM2's <|im_start|> at 1)
        # would make the name ambiguous: it becomes an unused slot
        return [family.tokens.get(i, f"<|rs_moved_{i}|>" if t in names else t)
                for i, t in enumerate(value)]

    def with_family_tokens(writer, vocab: int = 0) -> int:
        arrays, values = writer.add_array, writer.add_key_value
        tokens: list = []

        def add_array(key, value):
            if key == "tokenizer.ggml.tokens":
                tokens[:] = value
                value = vocabulary(value)
            elif key == "tokenizer.ggml.token_type":
                value = [_CONTROL if i in family.tokens else
                         _UNUSED if tokens[i] in names else
                         family.pad_type if t == _UNUSED else t for i, t in enumerate(value)]
            return arrays(key, value)

        def add_key_value(key, value, vtype, *rest):
            if key == "tokenizer.chat_template":
                value = family.template()
            value = family.token_ids.get(key, value)
            return values(key, value, vtype, *rest)

        writer.add_array, writer.add_key_value = add_array, add_key_value
        size = plain(writer, vocab)
        writer.add_array, writer.add_key_value = arrays, values
        return size

    make_gguf.copy_tokenizer = with_family_tokens
    try:
        return make_gguf.write(shape, out, recipe)
    finally:
        make_gguf.copy_tokenizer = plain


def mmproj_gguf(text_hidden: int, out: Path) -> Path:
    """A random SigLIP-so400m-896 tower + Gemma 3 projector (to ``text_hidden``) as an mmproj."""
    import torch
    from safetensors.torch import load_file, save_file
    from tiny_gemma3_mmproj import _release_name, gemma3_mmproj_gguf
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    config = Gemma3Config(
        text_config={"vocab_size": 512, "hidden_size": text_hidden, "intermediate_size": 64,
                     "num_hidden_layers": 1, "num_attention_heads": 2,
                     "num_key_value_heads": 1, "head_dim": 32},
        vision_config=SIGLIP_896, mm_tokens_per_image=256, boi_token_index=500,
        eoi_token_index=501, image_token_index=502)
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(config).float().eval()
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        del model
        (Path(folder) / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
        weights = str(Path(folder) / "model.safetensors")
        state = load_file(weights)
        save_file({_release_name(k): v for k, v in state.items()}, weights,
                  metadata={"format": "pt"})
        del state
        return gemma3_mmproj_gguf(folder, out, "f16")


QWEN25_VISION = {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                 "in_chans": 3, "patch_size": 14, "temporal_patch_size": 2,
                 "spatial_merge_size": 2, "window_size": 112,
                 "fullatt_block_indexes": [7, 15, 23, 31], "out_hidden_size": 2048,
                 "hidden_act": "silu", "tokens_per_second": 2}
QWEN25_PREPROCESSOR = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14,
                       "temporal_patch_size": 2, "merge_size": 2,
                       "image_mean": [0.48145466, 0.4578275, 0.40821073],
                       "image_std": [0.26862954, 0.26130258, 0.27577711],
                       "image_processor_type": "Qwen2VLImageProcessor",
                       "processor_class": "Qwen2_5_VLProcessor"}


def qwen25_mmproj_gguf(text_hidden: int, out: Path) -> Path:
    """A random Qwen2.5-VL-3B ViT + merger (to ``text_hidden``) as an mmproj: the tower
    alone, saved as the release names it (``visual.*``) beside a release config.json."""
    import torch
    from safetensors.torch import save_file
    from tiny_qwen25_vl import qwen25_vl_mmproj_gguf
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
        Qwen2_5_VisionTransformerPretrainedModel,
    )

    vision = dict(QWEN25_VISION, out_hidden_size=text_hidden)
    torch.manual_seed(0)
    fields = {k: v for k, v in vision.items() if k != "in_chans"}  # transformers: in_channels
    tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(
        Qwen2_5_VLVisionConfig(**fields), dtype=torch.float32).eval()
    state = {f"visual.{k}": v.detach().contiguous() for k, v in tower.state_dict().items()}
    del tower
    config = {"architectures": ["Qwen2_5_VLForConditionalGeneration"],
              "model_type": "qwen2_5_vl", "hidden_size": text_hidden, "rms_norm_eps": 1e-6,
              "vision_config": vision}
    with tempfile.TemporaryDirectory(dir=out.parent) as folder:
        save_file(state, str(Path(folder) / "model.safetensors"), metadata={"format": "pt"})
        del state
        for name, data in (("config.json", config),
                           ("preprocessor_config.json", QWEN25_PREPROCESSOR)):
            (Path(folder) / name).write_text(json.dumps(data, indent=2), encoding="utf-8")
        return qwen25_vl_mmproj_gguf(folder, out, "f16")


def _qwen25_template() -> str:
    from tiny_qwen25_vl import CHAT_TEMPLATE  # Qwen/Qwen2.5-VL-3B-Instruct's

    return CHAT_TEMPLATE


@dataclass(frozen=True)
class Family:
    """What a shape's two files need beyond make_gguf's text model."""
    tokens: dict[int, str]                    # special tokens at their release ids
    template: Callable[[], str]               # the release's chat template
    mmproj: Callable[[int, Path], Path]       # (text hidden size, out) -> the mmproj file
    token_ids: dict[str, int] = field(default_factory=dict)  # tokenizer.ggml.*_token_id
    # the type of make_gguf's padding slots: NORMAL where the release's vocabulary has no
    # unused ids, so that a random answer streams text on both servers (llama-server streams
    # nothing for an UNUSED token, which would delay its first content to a later token)
    pad_type: int = _UNUSED


FAMILIES = {
    "gemma-3-4b": Family(IMAGE_TOKENS, lambda: TEMPLATE.read_text(encoding="utf-8"),
                         mmproj_gguf),
    # the ids Qwen2.5-VL-3B-Instruct's converted GGUF carries (no BOS added: add_bos_token
    # stays the embedded tokenizer's False)
    "qwen2.5-vl-3b": Family(QWEN_TOKENS, _qwen25_template, qwen25_mmproj_gguf,
                            {"tokenizer.ggml.bos_token_id": 151643,
                             "tokenizer.ggml.eos_token_id": 151645,
                             "tokenizer.ggml.padding_token_id": 151643}, _NORMAL),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="gemma-3-4b", choices=sorted(FAMILIES))
    parser.add_argument("--recipe", default="q4_k_m", choices=make_gguf.RECIPES)
    parser.add_argument("--out", required=True, help="a folder for the two files")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    text = text_gguf(args.shape, args.recipe, out / f"{args.shape}-random-{args.recipe}.gguf")
    proj = FAMILIES[args.shape].mmproj(make_gguf.SHAPES[args.shape]["hidden"],
                                       out / f"mmproj-{args.shape}-random-f16.gguf")
    print(f"{text} and {proj} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
