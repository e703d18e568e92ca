"""Gemma 4's vision encoder in the engine against transformers' own
``Gemma4ForConditionalGeneration`` (tests/tiny_gemma4_vlm.py): the encoder (patch embedding,
x / y position rows, 2-D rotary, layers, pooling, embedder) = ``get_image_features``' pooled
rows for images of several grids, alone and two of one shape in one call, from the folder and
from mmproj GGUFs as llama.cpp's converter writes them; clipped linears and standardized rows;
the inputs ``tokens_for`` refuses; the fixture's greedy answers depend on the picture. Pixels
are transformers' Gemma4ImageProcessorPil output, each image's real patches
``pixel_values[i, :n]`` reshaped to ``[ph, pw, 3 * P * P]`` (the processor contract,
multimodal/gemma4.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tiny_gemma4_vlm as tiny
import torch
from PIL import Image
from transformers import AutoTokenizer, Gemma4ForConditionalGeneration
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

from radixserve.kernels import native
from radixserve.layers.block_linear import BlockLinear
from radixserve.models.vision import load_vision_encoder

CPU = torch.device("cpu")
ATOL = 1e-4
# (height, width) px → 18 x 30, 24 x 24 and 9 x 63 patches (60, 64 and 63 tokens)
SIZES = [(24, 36), (40, 40), (12, 80)]
_SETTINGS = {k: v for k, v in tiny.IMAGE_PROCESSOR.items()
             if k not in ("image_processor_type", "image_seq_length")}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny.make_gemma4_vlm_hf(tmp_path_factory.mktemp("gemma4vlm") / "hf", seed=1)


@pytest.fixture(scope="module")
def reference(folder):
    return Gemma4ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()


def _pictures(sizes, seed: int = 0, count: int = 1) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
            for h, w in sizes for _ in range(count)]


def _pixels(sizes, seed: int = 0, count: int = 1) -> dict:
    """transformers' processor output for ``count`` random pictures of each (h, w) size."""
    return Gemma4ImageProcessorPil(**_SETTINGS)(images=_pictures(sizes, seed, count),
                                                return_tensors="pt")


def _as_contract(out: dict) -> list[torch.Tensor]:
    """Each image's real patches as [ph, pw, D] (the processor contract)."""
    images = []
    for values, positions in zip(out["pixel_values"], out["image_position_ids"]):
        real = (positions >= 0).all(-1)
        ph, pw = int(positions[real, 1].max()) + 1, int(positions[real, 0].max()) + 1
        images.append(values[real].reshape(ph, pw, -1))
    return images


def _features(model, out: dict) -> list[torch.Tensor]:
    with torch.no_grad():
        return list(model.get_image_features(out["pixel_values"],
                                             out["image_position_ids"]).pooler_output)


def _rounded(folder, to: torch.dtype):
    """transformers' model with the vision matrices an mmproj stores in 16 bits rounded (the
    position table stays float32)."""
    model = Gemma4ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        for part in (model.model.vision_tower, model.model.embed_vision):
            for name, param in part.named_parameters():
                if param.ndim >= 2 and "position_embedding_table" not in name:
                    param.copy_(param.to(to).float())
    return model


@pytest.mark.parametrize("size", SIZES)
def test_folder_encoder_equals_transformers(folder, reference, size):
    out = _pixels([size])
    encoder = load_vision_encoder(str(folder), None, CPU, torch.float32)
    assert encoder.hidden_size == 64
    (pixels,), (want,) = _as_contract(out), _features(reference, out)
    assert encoder.tokens_for(list(pixels.shape), []) == len(want)
    assert len(want) == out["num_soft_tokens_per_image"][0]
    got = encoder(pixels[None])
    assert got.dtype == torch.float32 and got.shape == (1, len(want), 64)
    torch.testing.assert_close(got[0], want, atol=ATOL, rtol=0)
    assert "gemma4: ViT 2 layers" in encoder.describe()


def test_two_images_of_one_shape_in_one_call(folder, reference):
    """Each attends within itself: the batch = transformers' = each alone."""
    out = _pixels([(24, 36)], seed=2, count=2)
    encoder = load_vision_encoder(str(folder), None, CPU, torch.float32)
    batch = torch.stack(_as_contract(out))
    got = encoder(batch)
    want = torch.stack(_features(reference, out))
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    assert (got[0] - got[1]).abs().max() > 0.1  # two pictures, two answers
    torch.testing.assert_close(encoder(batch[1:]), got[1:], atol=1e-5, rtol=0)


def test_mmproj_f32_equals_transformers(folder, reference, tmp_path):
    path = tiny.gemma4_vlm_mmproj_gguf(folder, tmp_path / "mmproj-f32.gguf", "f32")
    encoder = load_vision_encoder(str(path), str(path), CPU, torch.float32)
    assert encoder.hidden_size == 64
    out = _pixels(SIZES)
    for pixels, want in zip(_as_contract(out), _features(reference, out)):
        torch.testing.assert_close(encoder(pixels[None])[0], want, atol=ATOL, rtol=0)


def test_mmproj_f16_equals_transformers_on_rounded_weights(folder, tmp_path):
    """The converter's F16 matrices (the patch kernel too) = transformers with those weights
    rounded; kept in 16 bits (BlockLinear) where the native kernels load."""
    path = tiny.gemma4_vlm_mmproj_gguf(folder, tmp_path / "mmproj-f16.gguf", "f16")
    encoder = load_vision_encoder(str(path), str(path), CPU, torch.float32)
    out = _pixels([(24, 36), (12, 80)])
    model = _rounded(folder, torch.float16)
    for pixels, want in zip(_as_contract(out), _features(model, out)):
        torch.testing.assert_close(encoder(pixels[None])[0], want, atol=1e-3, rtol=0)
    if native.load() is not None:
        stored = {t for m in encoder.modules() if isinstance(m, BlockLinear) for t in m.types}
        assert stored == {"F16"}


def test_clipped_and_standardized_tower_equals_transformers(tmp_path):
    """``use_clipped_linears`` (bounds that bite: the answer moves without them) and
    ``standardize``, from the folder and an f32 mmproj."""
    folder = tiny.make_gemma4_vlm_hf(tmp_path / "hf", seed=3, clipped=True, standardize=True)
    model = Gemma4ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    out = _pixels([(24, 36)], seed=4)
    (pixels,), (want,) = _as_contract(out), _features(model, out)
    mmproj = tiny.gemma4_vlm_mmproj_gguf(folder, tmp_path / "mmproj.gguf", "f32")
    for source, projector in ((folder, None), (mmproj, mmproj)):
        encoder = load_vision_encoder(str(source), projector and str(projector), CPU,
                                      torch.float32)
        assert "clipped linears" in encoder.describe()
        torch.testing.assert_close(encoder(pixels[None])[0], want, atol=ATOL, rtol=0)
    for module in model.modules():
        if hasattr(module, "use_clipped_linears"):
            module.use_clipped_linears = False
    (unclipped,) = _features(model, out)
    assert (unclipped - want).abs().max() > 0.05


@pytest.mark.parametrize("shape,grid,error", [
    ([18, 30, 47], [], "takes \\[ph, pw, 48\\]"),
    ([1, 18, 30, 48], [], "takes \\[ph, pw, 48\\]"),
    ([17, 30, 48], [], "not whole 3 x 3 pooling blocks"),
    ([18, 31, 48], [], "not whole 3 x 3 pooling blocks"),
    ([18, 30, 48], [1, 6, 10], "images take none"),
    ([3, 258, 48], [], "exceeds the 256 positions"),
])
def test_tokens_for_refuses_what_it_cannot_take(folder, shape, grid, error):
    encoder = load_vision_encoder(str(folder), None, CPU, torch.float32)
    with pytest.raises(ValueError, match=error):
        encoder.tokens_for(shape, grid)
    with pytest.raises(ValueError):
        encoder(torch.zeros(1, 17, 30, 48))


def test_a_folder_without_tower_weights_serves_text_only(folder, tmp_path, caplog):
    """A text-only copy of a release (config.json still names the tower): no encoder, a
    warning, not a failed start."""
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "text-only"
    copy.mkdir()
    (copy / "config.json").write_text((folder / "config.json").read_text())
    state = load_file(str(folder / "model.safetensors"))
    save_file({k: v for k, v in state.items() if ".vision_tower." not in k},
              str(copy / "model.safetensors"))
    assert load_vision_encoder(str(copy), None, CPU, torch.float32) is None
    assert "serving text only" in caplog.text


def _greedy(model, tokenizer, picture: Image.Image, steps: int = 8) -> list[int]:
    """transformers' greedy answer to a chat turn holding ``picture`` (the release template's
    ``<|image|>`` expanded as Gemma4Processor does)."""
    out = Gemma4ImageProcessorPil(**_SETTINGS)(images=[picture], return_tensors="pt")
    message = [{"role": "user", "content": [{"type": "image"},
                                            {"type": "text", "text": "What is this?"}]}]
    text = tokenizer.apply_chat_template(message, tokenize=False, add_generation_prompt=True)
    assert text.count(tiny.IMAGE) == 1
    n = int(out["num_soft_tokens_per_image"][0])
    text = text.replace(tiny.IMAGE, tiny.BOI + tiny.IMAGE * n + tiny.EOI)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    kinds = (ids == tokenizer.convert_tokens_to_ids(tiny.IMAGE)).long()  # 1: an image's row
    with torch.no_grad():
        answer = model.generate(ids, pixel_values=out["pixel_values"],
                                image_position_ids=out["image_position_ids"],
                                mm_token_type_ids=kinds, max_new_tokens=steps, do_sample=False)
    return answer[0, ids.shape[1]:].tolist()


def test_fixture_answers_depend_on_the_picture(folder, reference):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    first, second = _pictures([(24, 36)], seed=5, count=2)
    assert _greedy(reference, tokenizer, first) != _greedy(reference, tokenizer, second)


def test_fixture_bidirectional_variant_changes_the_answer(folder, reference, tmp_path):
    """``bidirectional=True``: the same weights, an image's rows seeing each other on the
    sliding layers (window 8, 60 image rows): another answer."""
    other = tiny.make_gemma4_vlm_hf(tmp_path / "bidi", seed=1, bidirectional=True)
    model = Gemma4ForConditionalGeneration.from_pretrained(other, dtype=torch.float32).eval()
    assert model.config.text_config.use_bidirectional_attention == "vision"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    (picture,) = _pictures([(24, 36)], seed=5)
    assert _greedy(model, tokenizer, picture) != _greedy(reference, tokenizer, picture)


def test_bfloat16_tower_stays_close(folder, reference):
    """The engine's dtype on CUDA (bfloat16 matrices and activations, norms and rotary in
    float32), run here on the CPU: float32 rows within 6% of the features' scale (a wrong
    layout is ~100% off)."""
    out = _pixels([(24, 36)])
    (pixels,), (want,) = _as_contract(out), _features(reference, out)
    got = load_vision_encoder(str(folder), None, CPU, torch.bfloat16)(pixels[None])[0]
    assert got.dtype == torch.float32
    assert (got - want).abs().max() < 0.06 * want.abs().max()


def test_layer_output_scales_are_refused(folder, tmp_path):
    """A tower with per-layer output scales (llama.cpp's ``v.blk.N.out_scale``; not in
    transformers' Gemma4VisionModel) is refused, not run without them."""
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "scaled"
    copy.mkdir()
    (copy / "config.json").write_text((folder / "config.json").read_text())
    state = load_file(str(folder / "model.safetensors"))
    state["model.vision_tower.encoder.layers.0.layer_scalar"] = torch.ones(1)
    save_file(state, str(copy / "model.safetensors"))
    with pytest.raises(ValueError, match="per-layer output scales"):
        load_vision_encoder(str(copy), None, CPU, torch.float32)
