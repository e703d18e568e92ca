"""Qwen2.5-VL and Qwen3.5 image preprocessing and prompt (radixserve/multimodal/qwen_vl.py,
qwen_vl_settings.py) against transformers: pixels bit for bit equal to the slow
``Qwen2VLImageProcessor`` (the Pillow backend) for every kind of image at both families'
release settings and at small pixel limits (the downscaling branch); grid and token count from
its ``image_grid_thw``; the token caps (``max_tokens``, ``detail="low"``); keys; refusals.
The prompt and the settings read from folders and mmproj files: test_qwen_vl_prompt.py."""

from __future__ import annotations

import dataclasses
import io
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from qwen_vl_folders import IMAGE_PAD, hf_image_processor

from radixserve.multimodal.qwen_vl import LOW_DETAIL_TOKENS, QwenVLImageProcessor, smart_resize

OURS = {  # the releases' processors (tests/qwen_vl_folders.py RELEASE_PREPROCESSORS)
    "qwen2.5-vl": QwenVLImageProcessor(7, "qwen2.5-vl", min_pixels=3136, max_pixels=12845056),
    "qwen3.5": QwenVLImageProcessor(7, "qwen3.5", 16, min_pixels=65536, max_pixels=16777216,
                                    image_mean=(0.5,) * 3, image_std=(0.5,) * 3),
}
SMALL = {"qwen2.5-vl": (3136, 64 * 28 * 28), "qwen3.5": (4 * 32 * 32, 48 * 32 * 32)}


def _noise(shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _alpha_gradient() -> Image.Image:
    alpha = np.tile(np.linspace(0, 255, 80).astype(np.uint8), (50, 1))[..., None]
    return Image.fromarray(np.concatenate([_noise((50, 80, 3), 1), alpha], axis=-1))


def _palette() -> Image.Image:
    image = Image.fromarray(_noise((40, 70, 3), 3)).convert("P", palette=Image.Palette.ADAPTIVE)
    image.info["transparency"] = int(np.asarray(image)[0, 0])
    return image


def _jpeg() -> Image.Image:
    y, x = np.mgrid[0:150, 0:210]
    rgb = np.stack([x, y, x + y], axis=-1).astype(np.uint8) ^ _noise((150, 210, 3), 4) // 8
    data = io.BytesIO()
    Image.fromarray(rgb).save(data, "JPEG", quality=80)  # no EXIF: Pillow writes none
    return Image.open(io.BytesIO(data.getvalue()))


IMAGES = {  # modes; thin, tiny, odd and large sizes; both orientations
    "rgb": lambda: Image.fromarray(_noise((37, 53, 3))),
    "rgba_transparent": _alpha_gradient,
    "grayscale_L": lambda: Image.fromarray(_noise((300, 500), 2)),
    "palette_P_transparency": _palette,
    "cmyk": lambda: Image.fromarray(_noise((33, 44, 3), 6)).convert("CMYK"),
    "thin_1x150": lambda: Image.fromarray(_noise((1, 150, 3), 7)),
    "thin_190x1": lambda: Image.fromarray(_noise((190, 1, 3), 8)),
    "tiny_10x10": lambda: Image.fromarray(_noise((10, 10, 3), 9)),
    "odd_333x517": lambda: Image.fromarray(_noise((333, 517, 3), 10)),
    "large_1200x1600": lambda: Image.fromarray(_noise((1200, 1600, 3), 11)),
    "jpeg_no_exif": _jpeg,
}


def _hf_rows(hf, image: Image.Image):
    out = hf(image, return_tensors="np")
    return out["pixel_values"], [int(v) for v in out["image_grid_thw"][0]]


def _check_equal(ours: QwenVLImageProcessor, hf, image: Image.Image, detail=None) -> None:
    before = image.tobytes()
    got = ours.process(image, detail=detail)
    assert image.tobytes() == before  # the caller's image is left alone
    rows, (t, h, w) = _hf_rows(hf, image)
    m = ours.merge_size
    assert got.pixels.dtype == np.float32 and got.pixels.flags.c_contiguous
    assert got.pixels.shape == (t, h, w, rows.shape[1])
    np.testing.assert_array_equal(got.pixels.reshape(rows.shape), rows)  # bit for bit
    assert got.grid == (t, h // m, w // m) and got.num_tokens == t * h * w // m ** 2


@pytest.mark.parametrize("family", sorted(OURS))
@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_pixels_equal_to_transformers_slow_processor(family, kind):
    _check_equal(OURS[family], hf_image_processor(family), IMAGES[kind]())


@pytest.mark.parametrize("family", sorted(OURS))
@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_small_pixel_limits_downscale_as_transformers(family, kind):
    low, high = SMALL[family]
    ours = dataclasses.replace(OURS[family], min_pixels=low, max_pixels=high)
    hf = hf_image_processor(family, min_pixels=low, max_pixels=high, size=None)
    _check_equal(ours, hf, IMAGES[kind]())
    assert ours.process(IMAGES[kind]()).num_tokens <= high // ours.factor ** 2


@pytest.mark.parametrize("size, message", [
    ((0, 5), "empty"), ((5, 0), "empty"), ((201, 1), "aspect ratio 201"),
    ((3, 700), "aspect ratio 233"),
])
def test_degenerate_images_are_refused(size, message):
    image = Image.new("RGB", size)
    for ours in OURS.values():
        with pytest.raises(ValueError, match=message):
            ours.process(image)
    if min(size) > 0:  # transformers refuses them too
        with pytest.raises(ValueError, match="aspect ratio"):
            _hf_rows(hf_image_processor("qwen3.5"), image)


def _sizes():
    """Image sizes from tiny to large, square to the flattest allowed (aspect 200)."""
    rng = np.random.default_rng(5)
    sizes = [(1, 200), (200, 1), (3, 600), (10, 10), (28, 5600), (4000, 3000), (17, 3400)]
    sizes += [tuple(int(v) for v in rng.integers(1, 5000, 2)) for _ in range(300)]
    return [(h, w) for h, w in sizes if max(h, w) / min(h, w) <= 200]


@pytest.mark.parametrize("family", sorted(OURS))
@pytest.mark.parametrize("cap", [1, 4, 16, 64, 100, 256, 1000])
def test_max_tokens_caps_every_image(family, cap):
    """tokens <= max(cap, min_pixels / (patch * merge)^2) for every size (the cap never
    lowers max_pixels below min_pixels)."""
    ours = dataclasses.replace(OURS[family], max_tokens=cap)
    f = ours.factor
    bound = max(cap, ours.min_pixels // f ** 2)
    for height, width in _sizes():
        h_bar, w_bar = ours.resized_size(height, width)
        assert h_bar % f == 0 and w_bar % f == 0 and h_bar * w_bar // f ** 2 <= bound
        plain = smart_resize(height, width, f, ours.min_pixels, max(cap * f * f, ours.min_pixels))
        if plain[0] * plain[1] <= bound * f * f:  # where transformers' size fits: that size
            assert (h_bar, w_bar) == plain


@pytest.mark.parametrize("family", sorted(OURS))
def test_max_tokens_downscales_as_transformers_with_that_max_pixels(family):
    ours = dataclasses.replace(OURS[family], max_tokens=300)
    hf = hf_image_processor(family, max_pixels=300 * ours.factor ** 2)
    for kind in ("large_1200x1600", "odd_333x517", "jpeg_no_exif"):
        _check_equal(ours, hf, IMAGES[kind]())
        assert ours.process(IMAGES[kind]()).num_tokens <= 300


@pytest.mark.parametrize("family", sorted(OURS))
def test_low_detail_allows_256_tokens(family):
    ours = OURS[family]
    image = IMAGES["large_1200x1600"]()
    low = ours.process(image, detail="low")
    assert low.num_tokens <= LOW_DETAIL_TOKENS == 256 and low.num_tokens > 200
    _check_equal(ours, hf_image_processor(family, max_pixels=256 * ours.factor ** 2), image,
                 detail="low")
    full = ours.process(image).num_tokens
    assert full > 1000 and {ours.process(image, detail=d).num_tokens
                            for d in ("high", "auto", None)} == {full}
    capped = dataclasses.replace(ours, max_tokens=100)  # the smaller cap wins
    assert capped.process(image, detail="low").num_tokens <= 100
    small = IMAGES["rgb"]()  # within the cap already: unchanged
    assert ours.process(small, detail="low").key == ours.process(small).key


def test_names_and_keys():
    a, b = OURS["qwen2.5-vl"], OURS["qwen3.5"]
    assert a.name.startswith("qwen2.5-vl/patch14/merge2/t2/pixels3136-12845056/resample3/")
    assert b.name.startswith("qwen3.5/patch16/") and "[0.5, 0.5, 0.5]" in b.name
    rgb = Image.fromarray(_noise((40, 60, 3), 11))
    first, again = a.process(rgb), a.process(rgb.convert("RGBA"))  # opaque: same pixels
    assert len(first.key) == 32 and first.key == again.key
    assert a.process(Image.fromarray(_noise((40, 60, 3), 12))).key != first.key
    other = dataclasses.replace(a, max_pixels=10**6)
    assert other.name != a.name and other.process(rgb).key != first.key
    assert a.placeholder == IMAGE_PAD and a.expand(first) == IMAGE_PAD * first.num_tokens


@pytest.mark.parametrize("change, message", [
    ({"patch_size": 0}, "patch_size must be a positive integer"),
    ({"min_pixels": 10**6, "max_pixels": 10**5}, "min_pixels 1000000 is over max_pixels"),
    ({"max_tokens": 0}, "max_tokens must be a positive integer"),
])
def test_bad_settings_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(OURS["qwen2.5-vl"], **change)


def test_the_modules_load_no_torch():
    code = ("import sys, radixserve.multimodal.qwen_vl_settings, radixserve.multimodal.select;"
            " print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False"]
