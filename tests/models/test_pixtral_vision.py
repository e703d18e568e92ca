"""Mistral 3's vision encoder (models/vision/pixtral.py: Pixtral + the Mistral 3 projector)
against transformers' ``Mistral3ForConditionalGeneration.get_image_features`` on the tiny
random checkpoint (tests/tiny_mistral3_vlm.py): from the folder (the releases' names and
``model.``-prefixed ones) and from the converter's mmproj (f32 exact; f16 equal to
transformers on the rounded weights; q8_0 close); one image, two of one shape in one call
(each attending only within itself); a feature layer before the last; the shapes and configs
it refuses; one progress beat per block."""

from __future__ import annotations

import json
import shutil

import pytest
import tiny_mistral3_vlm as tiny
import torch
from safetensors.torch import load_file, save_file
from transformers import Mistral3ForConditionalGeneration

from radixserve.kernels import native
from radixserve.layers import layer_progress
from radixserve.layers.block_linear import BlockLinear
from radixserve.models.vision import load_vision_encoder
from radixserve.models.vision.pixtral_load import pixtral_from_hf

CPU = torch.device("cpu")
ATOL = 1e-4
# [3, H, W]: 6 x 8 patches (3 x 4 tokens); 16 x 12 patches (the rope's full height)
SHAPES = {"small": (3, 84, 112), "tall": (3, 224, 168)}


@pytest.fixture(autouse=True)
def _float32_attention(monkeypatch):
    monkeypatch.setenv("RADIXSERVE_VISION_ATTENTION", "float32")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny.make_mistral3_vlm_hf(tmp_path_factory.mktemp("mistral3vl") / "hf", seed=3)


@pytest.fixture(scope="module")
def reference(folder):
    return Mistral3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()


def _pixels(shape, seed: int, n: int = 1) -> torch.Tensor:
    return torch.randn(n, *shape, generator=torch.Generator().manual_seed(seed))


def _features(model, pixels: torch.Tensor) -> torch.Tensor:
    """transformers' rows of ``n`` images of one shape: [n, tokens, text hidden]."""
    sizes = torch.tensor([list(pixels.shape[-2:])] * pixels.shape[0])
    with torch.no_grad():
        return torch.stack(model.model.get_image_features(pixels, sizes).pooler_output)


def test_folder_encoder_equals_transformers(folder, reference):
    encoder = load_vision_encoder(str(folder), None, CPU, torch.float32)
    assert encoder.hidden_size == 64 and encoder.deepstack_layers == 0
    for seed, shape in enumerate(SHAPES.values()):
        pixels = _pixels(shape, seed)
        want = _features(reference, pixels)
        got = encoder(pixels)
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert got.shape[1] == encoder.tokens_for(list(shape), [1, shape[1] // 28,
                                                                shape[2] // 28])
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    assert "pixtral: ViT 3 blocks" in encoder.describe() and "2x2 merged -> 64" in \
        encoder.describe()


def test_model_prefixed_names_load_the_same(folder, reference, tmp_path):
    """A folder with transformers 5's in-memory names (``model.vision_tower.*``)."""
    copy = tmp_path / "prefixed"
    shutil.copytree(folder, copy)
    state = load_file(str(copy / "model.safetensors"))
    save_file({f"model.{k}" if not k.startswith("lm_head") else k: v for k, v in state.items()},
              str(copy / "model.safetensors"))
    encoder = load_vision_encoder(str(copy), None, CPU, torch.float32)
    pixels = _pixels(SHAPES["small"], 5)
    torch.testing.assert_close(encoder(pixels), _features(reference, pixels), atol=ATOL,
                               rtol=0)


def test_two_images_of_one_shape_each_attend_within_themselves(folder, reference):
    encoder = load_vision_encoder(str(folder), None, CPU, torch.float32)
    pixels = _pixels(SHAPES["tall"], 7, n=2)
    got = encoder(pixels)
    for i in range(2):  # each alone through transformers
        torch.testing.assert_close(got[i], _features(reference, pixels[i:i + 1])[0],
                                   atol=ATOL, rtol=0)
    torch.testing.assert_close(got, _features(reference, pixels), atol=ATOL, rtol=0)


def test_an_earlier_feature_layer(folder, tmp_path):
    """``vision_feature_layer`` -2: the projector takes the second-to-last block's output."""
    copy = tmp_path / "layer"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "vision_feature_layer": -2}))
    model = Mistral3ForConditionalGeneration.from_pretrained(copy, dtype=torch.float32).eval()
    encoder = load_vision_encoder(str(copy), None, CPU, torch.float32)
    assert encoder.config.num_layers == 2
    pixels = _pixels(SHAPES["small"], 8)
    torch.testing.assert_close(encoder(pixels), _features(model, pixels), atol=ATOL, rtol=0)


def test_mmproj_f32_equals_transformers(folder, reference, tmp_path):
    path = tiny.mistral3_vlm_mmproj_gguf(folder, tmp_path / "mmproj-f32.gguf", "f32")
    encoder = load_vision_encoder(str(path), str(path), CPU, torch.float32)
    assert encoder.config.merge_size == 2 and encoder.config.hidden_act == "silu"
    for seed, shape in enumerate(SHAPES.values()):
        pixels = _pixels(shape, seed, n=2)
        torch.testing.assert_close(encoder(pixels), _features(reference, pixels), atol=ATOL,
                                   rtol=0)


def test_mmproj_f16_equals_transformers_on_rounded_weights(folder, tmp_path):
    """The converter's F16 matrices (the patch kernel too): transformers with those weights
    rounded; kept in F16 (BlockLinear) where the native kernels load."""
    path = tiny.mistral3_vlm_mmproj_gguf(folder, tmp_path / "mmproj-f16.gguf", "f16")
    encoder = load_vision_encoder(str(path), str(path), CPU, torch.float32)
    model = Mistral3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        for module in (model.model.vision_tower, model.model.multi_modal_projector):
            for param in module.parameters():
                if param.ndim >= 2:
                    param.copy_(param.half().float())
    pixels = _pixels(SHAPES["tall"], 2)
    torch.testing.assert_close(encoder(pixels), _features(model.eval(), pixels), atol=1e-3,
                               rtol=0)
    if native.load() is not None:
        stored = {t for m in encoder.modules() if isinstance(m, BlockLinear) for t in m.types}
        assert stored == {"F16"}


def test_mmproj_q8_0_runs_close_to_transformers(folder, reference, tmp_path):
    """Q8_0 matrices (and activations rounded to 8 bits where the native kernels run them):
    within 6% in norm (2.4% here; q and k rows left in llama.cpp's order are 28% off)."""
    path = tiny.mistral3_vlm_mmproj_gguf(folder, tmp_path / "mmproj-q8_0.gguf", "q8_0")
    encoder = load_vision_encoder(str(path), str(path), CPU, torch.float32)
    pixels = _pixels(SHAPES["tall"], 4)
    got, want = encoder(pixels), _features(reference, pixels)
    assert torch.linalg.norm(got - want) < 0.06 * torch.linalg.norm(want)


def test_tokens_for_takes_the_contract_and_refuses_the_rest(folder):
    encoder = load_vision_encoder(str(folder), None, CPU, torch.float32)
    assert encoder.tokens_for([3, 84, 112], [1, 3, 4]) == 12
    assert encoder.tokens_for([3, 224, 224], [1, 8, 8]) == 64
    for shape, grid, match in (
            ([3, 84], [1, 3, 4], "takes \\[3, H, W\\]"),
            ([1, 84, 112], [1, 3, 4], "takes \\[3, H, W\\]"),
            ([3, 0, 112], [1, 0, 4], "takes \\[3, H, W\\]"),
            ([3, 70, 112], [1, 2, 4], "not a multiple of 28 px"),
            ([3, 84, 112], [1, 4, 3], "expected \\[1, 3, 4\\]"),
            ([3, 84, 112], [], "expected \\[1, 3, 4\\]"),
            ([3, 252, 28], [1, 9, 1], "18 patches a side; the rope covers 16")):
        with pytest.raises(ValueError, match=match):
            encoder.tokens_for(shape, grid)
    with pytest.raises(ValueError, match="not a multiple"):
        encoder(torch.zeros(1, 3, 70, 112))


@pytest.mark.parametrize("change,match", [
    ({"vision_feature_layer": [-1, -2]}, "one layer only"),
    ({"vision_feature_layer": 9}, "outside the tower's 3 blocks"),
    ({"projector_hidden_act": "relu"}, "projector_hidden_act 'relu'"),
    ({"vision_config": {"hidden_act": "tanh"}}, "hidden_act 'tanh' is not supported"),
    ({"vision_config": {"model_type": "siglip_vision_model"}}, "Mistral 3's is 'pixtral'"),
    ({"vision_config": {"hidden_size": 48}}, "expected \\(48, 588\\)")])
def test_unsupported_configs_are_refused(folder, change, match):
    config = json.loads((folder / "config.json").read_text())
    for key, value in change.items():
        config[key] = {**config[key], **value} if key == "vision_config" else value
    with pytest.raises(ValueError, match=match):
        pixtral_from_hf(config, str(folder), CPU, torch.float32)


def test_every_block_is_a_progress_beat(folder):
    encoder = load_vision_encoder(str(folder), None, CPU, torch.float32)
    beats = []
    layer_progress.install(lambda: beats.append(1))
    try:
        encoder(_pixels(SHAPES["small"], 1))
    finally:
        layer_progress.install(None)
    assert len(beats) == encoder.config.num_layers == 3
