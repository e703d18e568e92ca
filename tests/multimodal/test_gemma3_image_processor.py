"""Gemma 3's image preprocessing (radixserve/multimodal/gemma3.py) against transformers' slow
``Gemma3ImageProcessor`` (the Pillow backend, what ``use_fast=False`` loads): the same float32
bits for every kind of image, with a release's settings and with others read from a folder."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

from radixserve.multimodal.gemma3 import Gemma3ImageProcessor, from_hf_folder

# google/gemma-3-4b-it's preprocessor_config.json (nulls: the processor's defaults)
RELEASE = {"do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None,
           "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
           "image_processor_type": "Gemma3ImageProcessor", "image_seq_length": 256,
           "image_std": [0.5, 0.5, 0.5], "pan_and_scan_max_num_crops": None,
           "pan_and_scan_min_crop_size": None, "pan_and_scan_min_ratio_to_activate": None,
           "processor_class": "Gemma3Processor", "resample": 2,
           "rescale_factor": 0.00392156862745098, "size": {"height": 896, "width": 896}}


def _hf(settings: dict) -> Gemma3ImageProcessorPil:
    skip = {"image_processor_type", "processor_class", "image_seq_length"}
    return Gemma3ImageProcessorPil(**{k: v for k, v in settings.items()
                                      if v is not None and k not in skip})


def _hf_pixels(processor: Gemma3ImageProcessorPil, image: Image.Image) -> np.ndarray:
    # do_convert_rgb as Gemma3Processor passes it (its images_kwargs default)
    out = processor(image, do_convert_rgb=True, return_tensors="np")
    assert out["num_crops"].tolist() == [0]
    return out["pixel_values"][0]


def _noise(shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _palette(transparent: bool) -> Image.Image:
    image = Image.fromarray(_noise((40, 70, 3), 3)).convert("P", palette=Image.Palette.ADAPTIVE)
    if transparent:
        image.info["transparency"] = int(np.asarray(image)[0, 0])
    return image


def _alpha_gradient() -> Image.Image:
    rgb = _noise((50, 80, 3), 1)
    alpha = np.tile(np.linspace(0, 255, 80).astype(np.uint8), (50, 1))[..., None]
    return Image.fromarray(np.concatenate([rgb, alpha], axis=-1))


def _smooth() -> Image.Image:
    """An upscaled photo-like gradient (the enlarging branch of the filter)."""
    y, x = np.mgrid[0:60, 0:100]
    rgb = np.stack([x * 2.5, y * 4.0, (x + y) * 1.5], axis=-1).clip(0, 255).astype(np.uint8)
    return Image.fromarray(rgb)


IMAGES = {
    "rgb": lambda: Image.fromarray(_noise((37, 53, 3))),
    "rgba_transparent": _alpha_gradient,
    "grayscale_L": lambda: Image.fromarray(_noise((300, 500), 2)),
    "gray_alpha_LA": lambda: Image.fromarray(_noise((30, 20, 2), 4)[..., 0]).convert("LA"),
    "palette_P": lambda: _palette(False),
    "palette_P_transparency": lambda: _palette(True),
    "bilevel_1": lambda: Image.fromarray(_noise((64, 64), 5)).convert("1"),
    "gray16_I;16": lambda: Image.fromarray(_noise((20, 30, 2), 13).view("<u2")[..., 0]),
    "cmyk": lambda: Image.fromarray(_noise((33, 44, 3), 6)).convert("CMYK"),
    "tiny_3x5": lambda: Image.fromarray(_noise((5, 3, 3), 7)),
    "huge_aspect_wide": lambda: Image.fromarray(_noise((7, 2400, 3), 8)),
    "huge_aspect_tall": lambda: Image.fromarray(_noise((1900, 9, 3), 9)),
    "large_downscale": lambda: Image.fromarray(_noise((1200, 1600, 3), 10)),
    "smooth_upscale": _smooth,
}


@pytest.fixture(scope="module")
def release_pair():
    return Gemma3ImageProcessor(image_token_id=7), _hf(RELEASE)


@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_equal_to_transformers_slow_processor(release_pair, kind):
    ours, hf = release_pair
    image = IMAGES[kind]()
    before = image.tobytes()
    got = ours.process(image, detail="high")
    assert image.tobytes() == before  # the caller's image is left alone
    want = _hf_pixels(hf, image)
    assert got.pixels.dtype == np.float32 and got.pixels.flags.c_contiguous
    assert got.pixels.shape == want.shape == (3, 896, 896)
    np.testing.assert_array_equal(got.pixels, want)  # bit for bit, not within a tolerance
    assert got.num_tokens == 256


def test_other_settings_read_from_a_folder(tmp_path):
    """Size, filter, mean/std and rescale from the folder's preprocessor_config.json, equal to
    transformers' processor built from the same file; tokens from config.json."""
    settings = {**RELEASE, "size": {"height": 48, "width": 64}, "resample": 3,
                "image_mean": [0.48145466, 0.4578275, 0.40821073],
                "image_std": [0.26862954, 0.26130258, 0.27577711]}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(settings))
    ours = from_hf_folder(tmp_path, {"mm_tokens_per_image": 16}, _StubTokenizer())
    assert (ours.size, ours.resample, ours.num_image_tokens) == ((48, 64), 3, 16)
    image = _alpha_gradient()
    np.testing.assert_array_equal(ours.process(image).pixels, _hf_pixels(_hf(settings), image))


def test_keys_name_the_pixels(release_pair):
    ours, _ = release_pair
    rgb = Image.fromarray(_noise((40, 60, 3), 11))
    opaque = rgb.convert("RGBA")  # alpha 255 everywhere: the same pixels once composited
    a, b = ours.process(rgb), ours.process(opaque)
    assert len(a.key) == 32 and a.key == b.key
    assert ours.process(Image.fromarray(_noise((40, 60, 3), 12))).key != a.key
    other = Gemma3ImageProcessor(image_token_id=7, num_image_tokens=64)
    assert other.process(rgb).key != a.key  # same pixels, other encoder output: other key


def test_expansion_is_gemma3_processors():
    p = Gemma3ImageProcessor(image_token_id=7, num_image_tokens=4)
    image = p.process(Image.new("RGB", (2, 2)))
    assert p.placeholder == "<start_of_image>"
    assert p.expand(image) == ("\n\n<start_of_image>" + "<image_soft_token>" * 4
                               + "<end_of_image>\n\n")


@pytest.mark.parametrize("change, message", [
    ({"do_pan_and_scan": True}, "pan-and-scan"),
    ({"do_resize": False}, "do_resize"),
    ({"do_normalize": False}, "do_normalize"),
    ({"size": {"shortest_edge": 896}}, "size"),
    ({"resample": 9}, "resample"),
    ({"image_mean": [0.5, 0.5]}, "image_mean"),
])
def test_settings_it_cannot_follow_are_refused(tmp_path, change, message):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**RELEASE, **change}))
    with pytest.raises(ValueError, match=message):
        from_hf_folder(tmp_path, {}, _StubTokenizer())


def test_an_unconvertible_mode_is_a_value_error(release_pair):
    ours, hf = release_pair
    image = Image.new("La", (4, 4))  # premultiplied alpha: Pillow converts it to nothing
    with pytest.raises(ValueError, match="cannot convert a La image"):
        ours.process(image)
    with pytest.raises(ValueError):  # transformers cannot either
        _hf_pixels(hf, image)


_STUB_IDS = {"<start_of_image>": 10, "<end_of_image>": 11, "<image_soft_token>": 12}


class _StubTokenizer:
    """The three Gemma 3 image tokens, each one special token (ids 10, 11, 12)."""

    def encode_prompt(self, text):
        return [_STUB_IDS[text]]

    def convert_ids_to_tokens(self, ids):
        names = {v: k for k, v in _STUB_IDS.items()}
        return [names[i] for i in ids]
