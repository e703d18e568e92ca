"""Qwen3-VL's vision tower in the engine against transformers' own
``Qwen3VLForConditionalGeneration`` (tests/tiny_qwen3_vl.py: 3 blocks, deepstack mergers after
blocks 0 and 1): the encoder's rows = ``get_image_features``' pooled output AND each of its
``deepstack_features``, side by side in that order (``[tokens, 64 * 3]``, llama.cpp's mmproj
layout), for images of several grids, alone and two of one shape in one call, from the folder
and from mmproj GGUFs as llama.cpp's converter writes them; what is refused. Pixels are
transformers' slow Qwen2VLImageProcessor's rows reshaped to ``[t, h, w, C*T*P*P]`` (the
processor contract, multimodal/qwen_vl.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tiny_qwen3_vl as tiny
import torch
from PIL import Image
from transformers import Qwen3VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from radixserve.kernels import native
from radixserve.layers.block_linear import BlockLinear
from radixserve.models.vision import load_vision_encoder
from radixserve.models.vision.qwen3_vl_load import qwen3_vl_vision_from_hf, qwen35_vision_from_hf

CPU = torch.device("cpu")
ATOL = 1e-4
TEXT = 64  # the text width: each set of rows' width
SIZES = [(96, 128), (64, 64), (160, 96)]  # (height, width) px: 6x8, 4x4 and 10x6 patches


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny.make_qwen3_vl_hf(tmp_path_factory.mktemp("qwen3vl") / "hf", seed=1)


@pytest.fixture(scope="module")
def reference(folder):
    return Qwen3VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def mmprojs(folder, tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3vl-mmproj")
    return {ftype: tiny.qwen3_vl_mmproj_gguf(folder, root / f"mmproj-{ftype}.gguf", ftype)
            for ftype in ("f32", "f16", "bf16", "q8_0")}


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
    """transformers' rows of each image: the pooled ones, then each deepstack feature's."""
    with torch.no_grad():
        out = model.get_image_features(pixel_values, grid_thw)
    assert len(out.deepstack_features) == len(tiny.DEEPSTACK)
    return [torch.cat([pooled, *(layer[i] for layer in out.deepstack_features)], dim=-1)
            for i, pooled in enumerate(out.pooler_output)]


def _rounded(folder, to: torch.dtype, keep_patch_kernel: bool):
    """transformers' model with the vision matrices an mmproj stores in 16 bits rounded (the
    patch kernel kept where the converter keeps it in float32)."""
    model = Qwen3VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.model.visual.named_parameters():
            if keep_patch_kernel and name == "patch_embed.proj.weight":
                continue
            if param.ndim >= 2 and name != "pos_embed.weight":
                param.copy_(param.to(to).float())
    return model


@pytest.mark.parametrize("size", SIZES)
def test_folder_encoder_equals_transformers(folder, reference, size):
    pv, thw = _pixels([size])
    encoder = load_vision_encoder(str(folder), None, CPU, torch.float32)
    assert encoder.hidden_size == TEXT and encoder.deepstack_layers == 2
    (pixels,), (want,) = _as_contract(pv, thw), _features(reference, pv, thw)
    t, h, w, _ = pixels.shape
    assert encoder.tokens_for(list(pixels.shape), [t, h // 2, w // 2]) == len(want)
    got = encoder(pixels[None])
    assert got.dtype == torch.float32 and got.shape == (1, len(want), TEXT * 3)
    torch.testing.assert_close(got[0], want, atol=ATOL, rtol=0)
    # three different sets of rows, not one repeated
    main, first, second = got[0].split(TEXT, dim=-1)
    assert (main - first).abs().max() > 0.1 and (first - second).abs().max() > 0.1
    assert "deepstack after blocks [0, 1]" in encoder.describe()


def test_two_images_of_one_shape_in_one_call(folder, reference):
    """Each attends within itself: the batch = transformers' = each alone."""
    pv, thw = _pixels([(96, 128)], seed=2, count=2)
    encoder = load_vision_encoder(str(folder), None, CPU, torch.float32)
    batch = torch.stack(_as_contract(pv, thw))
    got = encoder(batch)
    want = torch.stack(_features(reference, pv, thw))
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    assert (got[0] - got[1]).abs().max() > 0.1  # two pictures, two answers
    torch.testing.assert_close(encoder(batch[1:]), got[1:], atol=1e-5, rtol=0)


def test_mmproj_f32_equals_transformers(reference, mmprojs):
    path = str(mmprojs["f32"])
    encoder = load_vision_encoder(path, path, CPU, torch.float32)
    assert encoder.hidden_size == TEXT and encoder.deepstack_layers == 2
    pv, thw = _pixels(SIZES)
    for pixels, want in zip(_as_contract(pv, thw), _features(reference, pv, thw)):
        torch.testing.assert_close(encoder(pixels[None])[0], want, atol=ATOL, rtol=0)
    batch = torch.stack(_as_contract(*_pixels([(64, 64)], seed=3, count=2)))
    assert encoder(batch).shape == (2, 4, TEXT * 3)


@pytest.mark.parametrize("ftype,to", [("f16", torch.float16), ("bf16", torch.bfloat16)])
def test_mmproj_16bit_equals_transformers_on_rounded_weights(folder, mmprojs, ftype, to):
    """The converter's 16-bit matrices (deepstack mergers' too; the patch kernel as well in an
    f16 file, float32 in a bf16 one) = transformers with those weights rounded; kept in 16
    bits (BlockLinear) where the native kernels load."""
    path = str(mmprojs[ftype])
    encoder = load_vision_encoder(path, path, CPU, torch.float32)
    pv, thw = _pixels([(96, 128)])
    model = _rounded(folder, to, keep_patch_kernel=ftype == "bf16")
    (pixels,), (want,) = _as_contract(pv, thw), _features(model, pv, thw)
    torch.testing.assert_close(encoder(pixels[None])[0], want, atol=1e-3, rtol=0)
    if native.load() is not None:
        stored = {t for m in encoder.modules() if isinstance(m, BlockLinear) for t in m.types}
        assert stored == {ftype.upper()}


def test_mmproj_q8_0_close_to_transformers(reference, mmprojs):
    """Q8_0 matrices: within 2% of the features' scale (a wrong name or layout is ~100% off)."""
    path = str(mmprojs["q8_0"])
    pv, thw = _pixels([(96, 128)])
    (pixels,), (want,) = _as_contract(pv, thw), _features(reference, pv, thw)
    got = load_vision_encoder(path, path, CPU, torch.float32)(pixels[None])[0]
    for got_part, want_part in zip(got.split(TEXT, -1), want.split(TEXT, -1)):
        assert (got_part - want_part).abs().max() < 0.02 * want_part.abs().max()


@pytest.mark.parametrize("shape,grid,error", [
    ([1, 6, 8, 1535], [1, 3, 4], "takes \\[t, h, w, 1536\\]"),
    ([1, 5, 8, 1536], [1, 2, 4], "not whole 2 x 2 merge windows"),
    ([1, 6, 8, 1536], [1, 4, 3], "does not match"),
])
def test_tokens_for_refuses_what_it_cannot_take(folder, shape, grid, error):
    encoder = load_vision_encoder(str(folder), None, CPU, torch.float32)
    with pytest.raises(ValueError, match=error):
        encoder.tokens_for(shape, grid)


@pytest.mark.parametrize("indexes,error", [([0, 3], "not distinct blocks of the 3"),
                                           ([1, 1], "not distinct blocks"),
                                           ([0, 1, 2], "deepstack_merger_list.2.norm")])
def test_deepstack_layers_that_do_not_fit_are_refused(folder, indexes, error):
    config = json.loads((folder / "config.json").read_text())
    config["vision_config"]["deepstack_visual_indexes"] = indexes
    with pytest.raises(ValueError, match=error):
        qwen3_vl_vision_from_hf(config, str(folder), CPU, torch.float32)


def test_qwen35_builder_refuses_a_deepstack_tower(folder):
    """Qwen3.5's folders have no deepstack: one with it is not quietly served without it."""
    config = json.loads((folder / "config.json").read_text())
    with pytest.raises(ValueError, match="deepstack"):
        qwen35_vision_from_hf(config, str(folder), CPU, torch.float32)


def test_mmproj_without_a_deepstack_merger_is_refused(folder, tmp_path, monkeypatch):
    """An mmproj whose flags name a block with no ``v.deepstack.B.*`` tensors: a clear error."""
    original = tiny._mmproj_tensors

    def without_block_1(state, names, deepstack):
        return [(n, w) for n, w in original(state, names, deepstack)
                if not n.startswith("v.deepstack.1.")]

    monkeypatch.setattr(tiny, "_mmproj_tensors", without_block_1)
    path = str(tiny.qwen3_vl_mmproj_gguf(folder, tmp_path / "broken.gguf", "f32"))
    with pytest.raises(ValueError, match="mmproj tensor missing: 'v.deepstack.1.norm.weight'"):
        load_vision_encoder(path, path, CPU, torch.float32)


def test_deepstack_weights_of_the_wrong_width_are_refused(folder, tmp_path):
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "narrow"
    copy.mkdir()
    (copy / "config.json").write_text((folder / "config.json").read_text())
    state = load_file(str(folder / "model.safetensors"))
    key = "model.visual.deepstack_merger_list.0.norm"
    state[f"{key}.weight"] = state[f"{key}.weight"][:32].clone()
    state[f"{key}.bias"] = state[f"{key}.bias"][:32].clone()
    save_file(state, str(copy / "model.safetensors"))
    with pytest.raises(ValueError, match="norm.weight of width 32, expected 128"):
        load_vision_encoder(str(copy), None, CPU, torch.float32)
