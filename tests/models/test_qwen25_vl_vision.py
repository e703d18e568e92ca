"""Qwen2.5-VL's vision encoder (models/vision/qwen2_5_vl.py) against transformers'
``Qwen2_5_VLForConditionalGeneration.get_image_features`` on the tiny random checkpoint
(tests/tiny_qwen25_vl.py): from the folder in both layouts (releases' ``visual.*``,
transformers 5's ``model.visual.*``) and from the converter's mmproj (f32 exact; f16 / bf16
equal to transformers on the rounded weights; q8_0 close); one image, two of one shape in one
call; windows cut by the image's edge; the shapes it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import tiny_qwen25_vl as tiny
import torch
from PIL import Image
from transformers import Qwen2_5_VLForConditionalGeneration

from radixserve.kernels import native
from radixserve.layers.block_linear import BlockLinear
from radixserve.models.vision import load_vision_encoder
from radixserve.models.vision.qwen_vision_grid import VisionGrid

CPU = torch.device("cpu")
ATOL = 1e-4
# 300 x 200 px → 14 x 22 patches, 7 x 11 tokens: 2 x 3 windows of 4 x 4, the last row and
# column cut short; 150 x 100 → 8 x 10 patches, 4 x 5 tokens: a full window and a cut one
SIZES = {"wide": (300, 200), "small": (150, 100)}


@pytest.fixture(autouse=True)
def _float32_attention(monkeypatch):
    monkeypatch.setenv("RADIXSERVE_VISION_ATTENTION", "float32")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny.make_qwen25_vl_hf(tmp_path_factory.mktemp("qwen25vl") / "hf", seed=2)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return tiny.make_qwen25_vl_hf(tmp_path_factory.mktemp("qwen25vl-t5") / "hf", seed=2,
                                  layout="transformers")


@pytest.fixture(scope="module")
def reference(folder):
    return Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()


def _processed(folder, size: tuple[int, int], seed: int):
    """transformers' pixel_values and grid of a random picture."""
    from transformers import Qwen2VLImageProcessor

    w, h = size
    image = Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), np.uint8))
    out = Qwen2VLImageProcessor.from_pretrained(str(folder))(images=[image], return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


def _contract(pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
    """The encoder's input of one image: its rows as [t, h, w, D] (same bytes)."""
    t, h, w = grid_thw[0].tolist()
    return pixel_values.reshape(t, h, w, -1)


def _features(model, pixel_values, grid_thw) -> torch.Tensor:
    with torch.no_grad():
        return model.model.get_image_features(pixel_values, grid_thw).pooler_output[0]


@pytest.fixture(scope="module")
def images(folder):
    return {name: _processed(folder, size, seed) for seed, (name, size) in
            enumerate(SIZES.items())}


@pytest.mark.parametrize("layout", ["release", "transformers"])
def test_folder_encoder_equals_transformers(layout, folder, saved, reference, images):
    encoder = load_vision_encoder(str(folder if layout == "release" else saved), None, CPU,
                                  torch.float32)
    assert encoder.hidden_size == 64
    for pixel_values, grid_thw in images.values():
        want = _features(reference, pixel_values, grid_thw)
        got = encoder(_contract(pixel_values, grid_thw)[None])
        assert got.dtype == torch.float32 and got.shape == (1, *want.shape)
        torch.testing.assert_close(got[0], want, atol=ATOL, rtol=0)
    assert "qwen2.5-vl" in encoder.describe() and "full attention in [1, 3]" in \
        encoder.describe()


def test_two_images_of_one_shape_in_one_call_each_attend_within_themselves(
        folder, reference, images):
    encoder = load_vision_encoder(str(folder), None, CPU, torch.float32)
    (a, grid), (b, grid_b) = images["wide"], _processed(folder, SIZES["wide"], 7)
    assert torch.equal(grid, grid_b) and not torch.equal(a, b)
    got = encoder(torch.stack([_contract(a, grid), _contract(b, grid)]))
    torch.testing.assert_close(got[0], _features(reference, a, grid), atol=ATOL, rtol=0)
    torch.testing.assert_close(got[1], _features(reference, b, grid), atol=ATOL, rtol=0)


def test_mmproj_f32_equals_transformers(folder, reference, images, tmp_path):
    path = tiny.qwen25_vl_mmproj_gguf(folder, tmp_path / "mmproj-f32.gguf", "f32")
    encoder = load_vision_encoder(str(path), str(path), CPU, torch.float32)
    assert encoder.config.fullatt_layers == (1, 3) and encoder.config.window_size == 112
    for pixel_values, grid_thw in images.values():
        got = encoder(_contract(pixel_values, grid_thw)[None])[0]
        torch.testing.assert_close(got, _features(reference, pixel_values, grid_thw),
                                   atol=ATOL, rtol=0)


@pytest.mark.parametrize("ftype,to", [("f16", torch.float16), ("bf16", torch.bfloat16)])
def test_mmproj_16bit_equals_transformers_on_rounded_weights(folder, images, tmp_path, ftype,
                                                             to):
    """The converter's 16-bit matrices (the patch kernels F32 in a bf16 file): transformers
    with those weights rounded; kept in 16 bits (BlockLinear) where the native kernels load."""
    path = tiny.qwen25_vl_mmproj_gguf(folder, tmp_path / f"mmproj-{ftype}.gguf", ftype)
    encoder = load_vision_encoder(str(path), str(path), CPU, torch.float32)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.model.visual.named_parameters():
            if param.ndim == 2 or (param.ndim > 2 and ftype == "f16"):
                param.copy_(param.to(to).float())
    for pixel_values, grid_thw in images.values():
        got = encoder(_contract(pixel_values, grid_thw)[None])[0]
        want = _features(model.eval(), pixel_values, grid_thw)
        torch.testing.assert_close(got, want, atol=1e-3, rtol=0)
    if native.load() is not None:
        stored = {t for m in encoder.modules() if isinstance(m, BlockLinear) for t in m.types}
        assert stored == {ftype.upper()}


def test_mmproj_q8_0_runs_close_to_transformers(folder, reference, images, tmp_path):
    """Q8_0 matrices: within 3% of the features' scale (a wrong name or layout is ~100% off)."""
    path = tiny.qwen25_vl_mmproj_gguf(folder, tmp_path / "mmproj-q8_0.gguf", "q8_0")
    encoder = load_vision_encoder(str(path), str(path), CPU, torch.float32)
    pixel_values, grid_thw = images["wide"]
    got = encoder(_contract(pixel_values, grid_thw)[None])[0]
    want = _features(reference, pixel_values, grid_thw)
    assert (got - want).abs().max() < 0.03 * want.abs().max()


def test_tokens_for_takes_the_contract_and_refuses_the_rest(folder):
    encoder = load_vision_encoder(str(folder), None, CPU, torch.float32)
    dim = 3 * 2 * 14 * 14
    assert encoder.tokens_for([1, 14, 22, dim], [1, 7, 11]) == 77
    assert encoder.tokens_for([2, 4, 4, dim], [2, 2, 2]) == 8
    for shape, grid, match in (
            ([1, 14, 22, dim - 1], [1, 7, 11], "takes \\[t, h, w, 1176\\]"),
            ([3, 224, 224], [], "takes \\[t, h, w, 1176\\]"),
            ([1, 13, 22, dim], [1, 6, 11], "does not divide into 2 x 2"),
            ([1, 14, 22, dim], [1, 11, 7], "expected \\[1, 7, 11\\]"),
            ([1, 14, 22, dim], [], "expected \\[1, 7, 11\\]"),
            ([1, 0, 22, dim], [1, 0, 11], "takes")):
        with pytest.raises(ValueError, match=match):
            encoder.tokens_for(shape, grid)
    with pytest.raises(ValueError):
        encoder(torch.zeros(1, 1, 13, 22, dim))


@pytest.mark.parametrize("grid", [(1, 10, 6), (1, 16, 16), (2, 6, 10), (1, 2, 18)])
def test_windows_are_transformers_windows(grid):
    """The window order and lengths of a grid (in patches) = transformers'
    ``get_vision_window_index`` (merged tokens) for windows of 112 px, patch 14, merge 2."""
    from transformers.vision_utils import get_vision_window_index

    from radixserve.models.vision.qwen2_5_vl import Qwen25VisionConfig

    cfg = Qwen25VisionConfig(32, 64, 1, 2, 64, (0,))
    ours = VisionGrid((*grid, cfg.patch_dim), cfg, torch.ones(4), CPU)
    index, cu = get_vision_window_index(torch.tensor([grid]), 2, 112, 14)
    assert torch.equal(ours.order.view(-1, 4)[:, 0] // 4, index)
    lengths = (cu[1:] - cu[:-1]).tolist()
    split = ours.windows.split(torch.arange(ours.num_patches)[None])
    assert ours.windows.is_even == (len(set(lengths)) == 1)
    joined = ours.windows.join(split, 1)
    assert torch.equal(joined[0], torch.arange(ours.num_patches))
    assert ours.windows.lengths == lengths
    assert ours.frames.lengths == [grid[1] * grid[2]] * grid[0]


def test_two_frames_attend_each_within_itself(folder, reference):
    """A grid of two frames (what a video's clip gives): full attention and windows per frame,
    as transformers runs it."""
    gen = torch.Generator().manual_seed(3)
    grid = torch.tensor([[2, 8, 10]])
    rows = torch.randn(2 * 8 * 10, 3 * 2 * 14 * 14, generator=gen)
    encoder = load_vision_encoder(str(folder), None, CPU, torch.float32)
    got = encoder(_contract(rows, grid)[None])[0]
    torch.testing.assert_close(got, _features(reference, rows, grid), atol=ATOL, rtol=0)


def test_bfloat16_attention_is_close(folder, reference, images, monkeypatch):
    """RADIXSERVE_VISION_ATTENTION=bfloat16 (the AMX default): scores and sums in bfloat16,
    within 3% of the features' scale of float32's."""
    monkeypatch.setenv("RADIXSERVE_VISION_ATTENTION", "bfloat16")
    encoder = load_vision_encoder(str(folder), None, CPU, torch.float32)
    assert encoder.attention_dtype == torch.bfloat16
    pixel_values, grid_thw = images["wide"]
    got = encoder(_contract(pixel_values, grid_thw)[None])[0]
    want = _features(reference, pixel_values, grid_thw)
    assert (got - want).abs().max() < 0.03 * want.abs().max()
