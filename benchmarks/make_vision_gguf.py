"""Write a random-weight Gemma 3 vision model at a real size, as users run it: the text GGUF
(benchmarks/make_gguf.py's shape and recipe, its vocabulary given Gemma 3's image tokens at
their real ids and Gemma 3's chat template) and llama.cpp's mmproj GGUF of a SigLIP-so400m
tower at 896 px with Gemma 3's projector (tests/tiny_gemma3_mmproj.py's writer, the layout
``convert_hf_to_gguf.py --mmproj`` writes: F16 matrices, F32 embeddings), for speed
(benchmarks/image_side_by_side.py), not quality.

    .venv/bin/python benchmarks/make_vision_gguf.py --out /tmp/g3v     # ~4 min, ~3.2 GB
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import make_gguf  # noqa: E402

# Gemma 3's image tokens at their ids in the released vocabulary (262,208 entries)
IMAGE_TOKENS = {255999: "<start_of_image>", 256000: "<end_of_image>",
                262144: "<image_soft_token>"}
_CONTROL = 3  # llama.cpp's token type for special tokens
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
    """make_gguf's file with Gemma 3's image tokens and chat template."""
    plain = make_gguf.copy_tokenizer

    def with_image_tokens(writer, vocab: int = 0) -> int:
        arrays, values = writer.add_array, writer.add_key_value

        def add_array(key, value):
            if key == "tokenizer.ggml.tokens":
                value = [IMAGE_TOKENS.get(i, t) for i, t in enumerate(value)]
            elif key == "tokenizer.ggml.token_type":
                value = [_CONTROL if i in IMAGE_TOKENS else t for i, t in enumerate(value)]
            return arrays(key, value)

        def add_key_value(key, value, vtype, *rest):
            if key == "tokenizer.chat_template":
                value = TEMPLATE.read_text(encoding="utf-8")
            return values(key, value, vtype, *rest)

        writer.add_array, writer.add_key_value = add_array, add_key_value
        size = plain(writer, vocab)
        writer.add_array, writer.add_key_value = arrays, values
        return size

    make_gguf.copy_tokenizer = with_image_tokens
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="gemma-3-4b", choices=["gemma-3-4b"])
    parser.add_argument("--recipe", default="q4_k_m", choices=make_gguf.RECIPES)
    parser.add_argument("--out", required=True, help="a folder for the two files")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    text = text_gguf(args.shape, args.recipe, out / f"{args.shape}-random-{args.recipe}.gguf")
    proj = mmproj_gguf(make_gguf.SHAPES[args.shape]["hidden"],
                       out / f"mmproj-{args.shape}-random-f16.gguf")
    print(f"{text} and {proj} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
