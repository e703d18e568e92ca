"""Qwen3.5's vision tower in the engine against transformers' own
``Qwen3_5ForConditionalGeneration`` (tests/tiny_qwen35_vl.py): the encoder (patch embedding,
the resampled position table, 2-D rotary, blocks, merger) = ``get_image_features``'s pooled
output for images of several grids, alone and two of one shape in one call, from the folder and
from mmproj GGUFs as llama.cpp's converter writes them; the MoE model's folder; the inputs
``tokens_for`` refuses; ``ModelConfig.mrope`` from the folder and the text GGUF. Pixels are
transformers' slow Qwen2VLImageProcessor's rows reshaped to ``[t, h, w, C*T*P*P]`` (the
processor contract, multimodal/qwen_vl.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tiny_qwen35_vl as tiny
import torch
from PIL import Image
from tiny_hybrid import make_qwen35_moe_hf_model, qwen35_hf_to_gguf
from transformers import Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from radixserve.kernels import native
from radixserve.layers.block_linear import BlockLinear
from radixserve.model_config import MRopeParams
from radixserve.models.loader import load_model_config
from radixserve.models.source import ModelSource
from radixserve.models.vision import load_vision_encoder
from radixserve.models.vision.qwen3_vl_load import qwen35_vision_from_hf

CPU = torch.device("cpu")
ATOL = 1e-4
SIZES = [(40, 56), (64, 64), (16, 24)]  # (height, width) px: 10x14, 16x16 and 4x6 patches


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny.make_qwen35_vl_hf(tmp_path_factory.mktemp("qwen35vl") / "hf", seed=1)


@pytest.fixture(scope="module")
def reference(folder):
    return Qwen3_5ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()


def _pixels(sizes, seed: int = 0, count: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(pixel_values, image_grid_thw) of ``count`` random pictures of each (h, w) size."""
    processor = Qwen2VLImageProcessorPil(**{k: v for k, v in tiny.PREPROCESSOR.items()
                                            if not k.endswith(("_class", "_type"))})
    rng = np.random.default_rng(seed)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
              for h, w in sizes for _ in range(count)]
    out = processor(images=images, return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


def _as_contract(pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> list[torch.Tensor]:
    """Each image's rows as [t, h, w, D] (the processor contract)."""
    sizes = grid_thw.prod(-1).tolist()
    return [rows.reshape(*thw.tolist(), -1)
            for rows, thw in zip(pixel_values.split(sizes), grid_thw)]


def _features(model, pixel_values, grid_thw) -> list[torch.Tensor]:
    with torch.no_grad():
        return list(model.get_image_features(pixel_values, grid_thw).pooler_output)


def _rounded(folder, to: torch.dtype):
    """transformers' model with the vision matrices an mmproj stores in 16 bits rounded."""
    model = Qwen3_5ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.model.visual.named_parameters():
            if param.ndim >= 2 and name != "pos_embed.weight":
                param.copy_(param.to(to).float())
    return model


@pytest.mark.parametrize("size", SIZES)
def test_folder_encoder_equals_transformers(folder, reference, size):
    pv, thw = _pixels([size])
    encoder = load_vision_encoder(str(folder), None, CPU, torch.float32)
    assert encoder.hidden_size == 64
    (pixels,), (want,) = _as_contract(pv, thw), _features(reference, pv, thw)
    t, h, w, _ = pixels.shape
    assert encoder.tokens_for(list(pixels.shape), [t, h // 2, w // 2]) == len(want)
    got = encoder(pixels[None])
    assert got.dtype == torch.float32 and got.shape == (1, len(want), 64)
    torch.testing.assert_close(got[0], want, atol=ATOL, rtol=0)
    assert "qwen3_vl: ViT 2 layers" in encoder.describe()


def test_two_images_of_one_shape_in_one_call(folder, reference):
    """Each attends within itself: the batch = transformers' = each alone."""
    pv, thw = _pixels([(40, 56)], seed=2, count=2)
    encoder = load_vision_encoder(str(folder), None, CPU, torch.float32)
    batch = torch.stack(_as_contract(pv, thw))
    got = encoder(batch)
    want = torch.stack(_features(reference, pv, thw))
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    assert (got[0] - got[1]).abs().max() > 0.1  # two pictures, two answers
    torch.testing.assert_close(encoder(batch[1:]), got[1:], atol=1e-5, rtol=0)


def test_mmproj_f32_equals_transformers(folder, reference, tmp_path):
    path = tiny.qwen35_vl_mmproj_gguf(folder, tmp_path / "mmproj-f32.gguf", "f32")
    encoder = load_vision_encoder(str(path), str(path), CPU, torch.float32)
    pv, thw = _pixels(SIZES)
    for pixels, want in zip(_as_contract(pv, thw), _features(reference, pv, thw)):
        torch.testing.assert_close(encoder(pixels[None])[0], want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("ftype,to", [("f16", torch.float16), ("bf16", torch.bfloat16)])
def test_mmproj_16bit_equals_transformers_on_rounded_weights(folder, tmp_path, ftype, to):
    """The converter's 16-bit matrices (the patch kernel too, in an f16 file: float32 in a bf16
    one) = transformers with those weights rounded; kept in 16 bits (BlockLinear) where the
    native kernels load."""
    path = tiny.qwen35_vl_mmproj_gguf(folder, tmp_path / f"mmproj-{ftype}.gguf", ftype)
    encoder = load_vision_encoder(str(path), str(path), CPU, torch.float32)
    pv, thw = _pixels([(40, 56)])
    model = _rounded(folder, to)
    if ftype == "bf16":  # the converter keeps the patch kernel in float32 there
        reference = Qwen3_5ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
        with torch.no_grad():
            model.model.visual.patch_embed.proj.weight.copy_(
                reference.model.visual.patch_embed.proj.weight)
    (pixels,), (want,) = _as_contract(pv, thw), _features(model, pv, thw)
    torch.testing.assert_close(encoder(pixels[None])[0], want, atol=1e-3, rtol=0)
    if native.load() is not None:
        stored = {t for m in encoder.modules() if isinstance(m, BlockLinear) for t in m.types}
        assert stored == {ftype.upper()}


def test_mmproj_q8_0_close_to_transformers(folder, reference, tmp_path):
    """Q8_0 matrices: within 2% of the features' scale (a wrong name or layout is ~100% off)."""
    path = tiny.qwen35_vl_mmproj_gguf(folder, tmp_path / "mmproj-q8_0.gguf", "q8_0")
    pv, thw = _pixels([(40, 56)])
    (pixels,), (want,) = _as_contract(pv, thw), _features(reference, pv, thw)
    got = load_vision_encoder(str(path), str(path), CPU, torch.float32)(pixels[None])[0]
    assert (got - want).abs().max() < 0.02 * want.abs().max()


def test_moe_folder_encoder_equals_transformers(tmp_path):
    """Qwen3_5MoeForConditionalGeneration's tower (tests/tiny_hybrid.py's: 1 block, a 4 x 4
    position table) loads the same way."""
    folder = make_qwen35_moe_hf_model(tmp_path / "moe", seed=2, conditional=True)
    model = Qwen3_5MoeForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    encoder = load_vision_encoder(str(folder), None, CPU, torch.float32)
    pv, thw = _pixels([(40, 56)])
    (pixels,), (want,) = _as_contract(pv, thw), _features(model.eval(), pv, thw)
    torch.testing.assert_close(encoder(pixels[None])[0], want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("shape,grid,error", [
    ([1, 10, 14, 95], [1, 5, 7], "takes \\[t, h, w, 96\\]"),
    ([10, 14, 96], [1, 5, 7], "takes \\[t, h, w, 96\\]"),
    ([1, 9, 14, 96], [1, 4, 7], "not whole 2 x 2 merge windows"),
    ([1, 10, 14, 96], [1, 7, 5], "does not match"),
    ([1, 10, 14, 96], [], "does not match"),
])
def test_tokens_for_refuses_what_it_cannot_take(folder, shape, grid, error):
    encoder = load_vision_encoder(str(folder), None, CPU, torch.float32)
    with pytest.raises(ValueError, match=error):
        encoder.tokens_for(shape, grid)
    with pytest.raises(ValueError):
        encoder(torch.zeros(1, 1, 9, 14, 96))


def test_deepstack_towers_are_refused(folder):
    """Qwen3-VL's deepstack mergers are not run: refused, not silently dropped."""
    config = json.loads((folder / "config.json").read_text())
    config["vision_config"]["deepstack_visual_indexes"] = [0]
    with pytest.raises(ValueError, match="deepstack"):
        qwen35_vision_from_hf(config, str(folder), CPU, torch.float32)


def test_text_model_has_interleaved_mrope_from_folder_and_gguf(folder, tmp_path):
    gguf = qwen35_hf_to_gguf(folder, tmp_path / "text.gguf", "F32")
    want = MRopeParams((2, 1, 1), interleaved=True)
    for path in (folder, gguf):
        config = load_model_config(ModelSource.resolve(str(path)))
        assert config.mrope == want and config.rotary_dim == 8


def test_a_folder_without_tower_weights_serves_text_only(folder, tmp_path, caplog):
    """A text-only copy of a release (config.json still names the tower): no encoder, a
    warning, not a failed start."""
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "text-only"
    copy.mkdir()
    (copy / "config.json").write_text((folder / "config.json").read_text())
    state = load_file(str(folder / "model.safetensors"))
    save_file({k: v for k, v in state.items() if not k.startswith("model.visual.")},
              str(copy / "model.safetensors"))
    assert load_vision_encoder(str(copy), None, CPU, torch.float32) is None
    assert "serving text only" in caplog.text
