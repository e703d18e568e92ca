"""Gemma 4 image preprocessing and prompt (radixserve/multimodal/gemma4.py) against
transformers: pixels bit for bit equal to the slow ``Gemma4ImageProcessorPil`` (its
``pixel_values[0, :n]``, the unpadded patches) for every kind of image at two budgets, token
counts from its ``num_soft_tokens_per_image``; ``detail`` and ``max_tokens``; prompt ids equal
to ``Gemma4Processor.apply_chat_template``'s on a weight-free release-like folder
(tests/gemma4_image_folders.py); the settings of folders and llama.cpp mmproj files; refusals."""

from __future__ import annotations

import dataclasses
import io
import json
import subprocess
import sys
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
from gemma4_image_folders import (
    BOI_TOKEN,
    EOI_TOKEN,
    IMAGE_TOKEN,
    hf_image_processor,
    hf_processor,
    make_gemma4_folder,
)
from PIL import Image

from radixserve.frontend.chat_images import render_chat_images
from radixserve.frontend.openai.protocol_chat import ChatCompletionRequest
from radixserve.multimodal.gemma4 import SUPPORTED_BUDGETS, Gemma4ImageProcessor, target_size
from radixserve.multimodal.select import image_processor_for
from radixserve.tokenizer.tokenizer import Tokenizer

OURS = Gemma4ImageProcessor(7)  # the releases' settings


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


IMAGES = {  # modes; thin, tiny, odd, exact and huge sizes; both orientations
    "rgb": lambda: Image.fromarray(_noise((37, 53, 3))),
    "rgba_transparent": _alpha_gradient,
    "grayscale_L": lambda: Image.fromarray(_noise((300, 500), 2)),
    "palette_P_transparency": _palette,
    "cmyk": lambda: Image.fromarray(_noise((33, 44, 3), 6)).convert("CMYK"),
    "thin_1x150": lambda: Image.fromarray(_noise((1, 150, 3), 7)),
    "thin_190x1": lambda: Image.fromarray(_noise((190, 1, 3), 8)),
    "thin_2x20000": lambda: Image.fromarray(_noise((2, 20000, 3), 13)),  # past the longest edge
    "tiny_1x1": lambda: Image.fromarray(_noise((1, 1, 3), 14)),
    "tiny_10x10": lambda: Image.fromarray(_noise((10, 10, 3), 9)),
    "odd_333x517": lambda: Image.fromarray(_noise((333, 517, 3), 10)),
    "exact_672x960": lambda: Image.fromarray(_noise((672, 960, 3), 15)),  # 280 windows: kept
    "huge_3000x4000": lambda: Image.fromarray(_noise((3000, 4000, 3), 11)),
    "jpeg_no_exif": _jpeg,
}


def _check_equal(ours: Gemma4ImageProcessor, hf, image: Image.Image, detail=None):
    """``ours`` gives transformers' unpadded patches, grid and token count for ``image``."""
    before = image.tobytes()
    got = ours.process(image, detail=detail)
    assert image.tobytes() == before  # the caller's image is left alone
    out = hf(image, return_tensors="np")
    rows, positions = out["pixel_values"][0], out["image_position_ids"][0]
    n = int((positions[:, 0] >= 0).sum())
    pw, ph = int(positions[:n, 0].max()) + 1, int(positions[:n, 1].max()) + 1
    assert got.pixels.dtype == np.float32 and got.pixels.flags.c_contiguous
    assert got.pixels.shape == (ph, pw, rows.shape[1]) and ph * pw == n
    np.testing.assert_array_equal(got.pixels.reshape(n, -1), rows[:n])  # bit for bit
    # positions: x = column, y = row, row-major, as the encoder reads the grid
    assert positions[:n].tolist() == [[x, y] for y in range(ph) for x in range(pw)]
    kernel_area = ours.pooling_kernel_size ** 2
    assert got.num_tokens == int(out["num_soft_tokens_per_image"][0]) == n // kernel_area
    assert got.grid == () and len(got.key) == 32
    return got


@pytest.mark.parametrize("budget", [280, 70])
@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_pixels_equal_to_transformers_slow_processor(kind, budget):
    ours = dataclasses.replace(OURS, max_soft_tokens=budget)
    got = _check_equal(ours, hf_image_processor(max_soft_tokens=budget), IMAGES[kind]())
    assert 0 < got.num_tokens <= budget


def test_largest_budget_and_other_settings_equal_to_transformers():
    big = dataclasses.replace(OURS, max_soft_tokens=1120)
    for kind in ("huge_3000x4000", "thin_2x20000", "odd_333x517"):
        assert _check_equal(big, hf_image_processor(max_soft_tokens=1120),
                            IMAGES[kind]()).num_tokens <= 1120
    # normalization on, another filter, patch and kernel
    changes = {"do_normalize": True, "image_mean": [0.5, 0.25, 0.0], "image_std": [0.5, 2.0, 1.0],
               "resample": 2, "patch_size": 8, "pooling_kernel_size": 2, "max_soft_tokens": 140}
    other = Gemma4ImageProcessor(7, 8, 2, 140, resample=2, image_mean=(0.5, 0.25, 0.0),
                                 image_std=(0.5, 2.0, 1.0))
    for kind in ("rgba_transparent", "odd_333x517", "thin_190x1"):
        _check_equal(other, hf_image_processor(**changes), IMAGES[kind]())


def test_sizes_against_transformers_for_many_shapes():
    from transformers.models.gemma4.image_processing_pil_gemma4 import (
        get_aspect_ratio_preserving_size,
    )

    rng = np.random.default_rng(5)
    sizes = [(1, 1), (1, 10**5), (10**5, 1), (47, 48), (48, 48), (2, 3), (20, 3000)]
    sizes += [tuple(int(v) for v in rng.integers(1, 6000, 2)) for _ in range(400)]
    for budget in SUPPORTED_BUDGETS:
        for h, w in sizes:
            want = get_aspect_ratio_preserving_size(h, w, 16, budget * 9, 3)
            got = target_size(h, w, 16, budget * 9, 3)
            assert got == want and got[0] % 48 == 0 and got[1] % 48 == 0
            assert got[0] * got[1] // 48 ** 2 <= budget


def test_detail_and_max_tokens_pick_the_budget():
    image = IMAGES["huge_3000x4000"]()
    low = OURS.process(image, detail="low")
    _check_equal(OURS, hf_image_processor(max_soft_tokens=70), image, detail="low")
    assert low.num_tokens <= 70 < OURS.process(image).num_tokens <= 280
    assert {OURS.process(image, detail=d).key for d in ("high", "auto", None)} == {
        OURS.process(image).key}
    big = dataclasses.replace(OURS, max_soft_tokens=1120)
    cases = {None: 1120, 5000: 1120, 1120: 1120, 1119: 560, 600: 560, 280: 280, 100: 70,
             70: 70, 1: 70}  # the largest supported budget within the cap, at least 70
    for cap, budget in cases.items():
        capped = dataclasses.replace(big, max_tokens=cap)
        assert capped.budget() == budget and capped.budget("low") == 70
        assert capped.process(image).num_tokens <= budget
    _check_equal(dataclasses.replace(big, max_tokens=600), hf_image_processor(max_soft_tokens=560),
                 image)
    assert dataclasses.replace(OURS, max_tokens=1000).budget() == 280  # a cap, never a raise


def test_names_keys_and_prompt_text():
    rgb = Image.fromarray(_noise((40, 60, 3), 11))
    first, again = OURS.process(rgb), OURS.process(rgb.convert("RGBA"))  # opaque: same pixels
    assert first.key == again.key
    assert OURS.process(Image.fromarray(_noise((40, 60, 3), 12))).key != first.key
    assert OURS.name == "gemma4/patch16/pool3/resample3/scale0.00392156862745098" \
                        "/mean[0.0, 0.0, 0.0]/std[1.0, 1.0, 1.0]"
    other = dataclasses.replace(OURS, resample=2)
    assert other.name != OURS.name and other.process(rgb).key != first.key
    assert OURS.placeholder == IMAGE_TOKEN
    assert OURS.expand(first) == BOI_TOKEN + IMAGE_TOKEN * first.num_tokens + EOI_TOKEN


@pytest.mark.parametrize("size", [(0, 5), (5, 0), (0, 0)])
def test_empty_images_are_refused(size):
    with pytest.raises(ValueError, match="empty"):
        OURS.process(Image.new("RGB", size))


@pytest.mark.parametrize("change, message", [
    ({"patch_size": 0}, "patch_size must be a positive integer"),
    ({"pooling_kernel_size": True}, "pooling_kernel_size must be a positive integer"),
    ({"max_soft_tokens": 300}, r"max_soft_tokens must be one of \(70, 140, 280, 560, 1120\)"),
    ({"max_tokens": 0}, "max_tokens must be a positive integer"),
])
def test_bad_settings_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(OURS, **change)


def test_the_modules_load_no_torch():
    code = ("import sys, radixserve.multimodal.gemma4 as g, radixserve.multimodal.select;"
            " from PIL import Image; g.Gemma4ImageProcessor(1).process(Image.new('RGB', (9, 7)));"
            " print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False"]


# ------------------------------------------------------------------ prompt and settings


def _img(detail: str | None = None) -> dict:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA",
                                               "detail": detail}}


def _text(text: str) -> dict:
    return {"type": "text", "text": text}


CONVERSATION = [
    {"role": "user", "content": [_text("What is in"), _img(), _text("and in"), _img("auto")]},
    {"role": "assistant", "content": "Noise, twice."},
    {"role": "user", "content": [_img("high"), _text("  And this one?  ")]},
]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(folder, a serving context with the folder's tokenizer and processor): budget 70."""
    folder = make_gemma4_folder(tmp_path_factory.mktemp("gemma4") / "hf", max_soft_tokens=70)
    tok = Tokenizer.from_hf_dir(folder)
    return folder, SimpleNamespace(tokenizer=tok, images=image_processor_for(str(folder), None,
                                                                             tok))


def test_prompt_ids_equal_to_transformers_processor(served):
    folder, ctx = served
    images = [IMAGES["odd_333x517"](), IMAGES["rgba_transparent"](), IMAGES["thin_190x1"]()]
    text, ids, inputs = render_chat_images(
        ctx, ChatCompletionRequest(model="m", messages=CONVERSATION), images)
    todo = iter(images)
    hf_messages = [{**m, "content": [{"type": "image", "image": next(todo)}
                                     if p["type"] == "image_url" else p for p in m["content"]]}
                   if isinstance(m["content"], list) else m for m in CONVERSATION]
    want = hf_processor(folder, max_soft_tokens=70).apply_chat_template(
        hf_messages, add_generation_prompt=True, tokenize=True, return_dict=True,
        return_tensors="np")
    assert ids == want["input_ids"][0].tolist()
    assert text.count(BOI_TOKEN) == 3 and text.count(EOI_TOKEN) == 3
    boi, eoi = ctx.tokenizer.encode_prompt(BOI_TOKEN + EOI_TOKEN)
    for i, hf_rows in zip(inputs, want["pixel_values"], strict=True):
        ph, pw, width = i.shape
        assert i.length == ph * pw // 9 and i.grid == []
        assert ids[i.offset - 1] == boi and ids[i.offset + i.length] == eoi
        assert set(ids[i.offset:i.offset + i.length]) == {ctx.images.image_token_id}
        rows = np.frombuffer(i.pixels, np.float32).reshape(ph * pw, width)
        np.testing.assert_array_equal(rows, hf_rows[:ph * pw])  # bit for bit


def test_an_image_token_typed_in_the_text_is_refused(served):
    _, ctx = served
    messages = [{"role": "user", "content": [_text(f"Look: {IMAGE_TOKEN}"), _img()]}]
    with pytest.raises(ValueError, match=r"holds <\|image\|> 2 times for 1 images"):
        render_chat_images(ctx, ChatCompletionRequest(model="m", messages=messages),
                           [IMAGES["rgb"]()])


def test_folder_settings(tmp_path):
    for i, preprocessor_file in enumerate((False, True)):
        folder = make_gemma4_folder(tmp_path / str(i), preprocessor_file=preprocessor_file)
        tok = Tokenizer.from_hf_dir(folder)
        p = image_processor_for(str(folder), None, tok)
        assert p == Gemma4ImageProcessor(tok.encode_prompt(IMAGE_TOKEN)[0])
    # transformers' defaults where the file says nothing; the architecture alone names it
    folder = make_gemma4_folder(tmp_path / "bare", max_soft_tokens=None, resample=None,
                                patch_size=None, pooling_kernel_size=None, do_normalize=True,
                                image_mean=None, image_std=None,
                                config_changes={"model_type": None, "vision_config": {}})
    p = image_processor_for(str(folder), None, Tokenizer.from_hf_dir(folder))
    hf = hf_image_processor(max_soft_tokens=None, resample=None, patch_size=None,
                            pooling_kernel_size=None, image_mean=None, image_std=None)
    assert (p.max_soft_tokens, p.resample, p.patch_size, p.pooling_kernel_size) == (
        hf.max_soft_tokens, hf.resample, hf.patch_size, hf.pooling_kernel_size)
    assert (list(p.image_mean), list(p.image_std)) == (list(hf.image_mean), list(hf.image_std))
    # the encoder's sizes where the preprocessor does not say them
    folder = make_gemma4_folder(tmp_path / "vision", patch_size=None, pooling_kernel_size=None,
                                config_changes={"vision_config": {"patch_size": 14,
                                                                  "pooling_kernel_size": 2}})
    p = image_processor_for(str(folder), None, Tokenizer.from_hf_dir(folder))
    assert (p.patch_size, p.pooling_kernel_size) == (14, 2)


@pytest.mark.parametrize("change", [{"model_type": "gemma4_text"}, {"vision_config": None}])
def test_text_only_configs_take_no_images(tmp_path, change):
    folder = make_gemma4_folder(tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))  # null kept
    assert image_processor_for(str(folder), None, Tokenizer.from_hf_dir(folder)) is None


@pytest.mark.parametrize("change, config, message", [
    ({"do_resize": False}, None, "do_resize: false is not supported"),
    ({"max_soft_tokens": 256}, None, "max_soft_tokens must be one of"),
    ({"patch_size": 14}, None, "patch_size 14 is not the vision encoder's 16"),
    ({"resample": 9}, None, "resample"),
    ({"rescale_factor": "x"}, None, "rescale_factor"),
    ({"do_normalize": True, "image_std": [0.5, 0.5]}, None, "image_std"),
    ({}, {"image_token_id": 3}, r"image_token_id 3 is not the tokenizer's <\|image\|>"),
    ({}, {"boi_token_id": 3}, r"boi_token_id 3 is not the tokenizer's <\|image>"),
])
def test_settings_it_cannot_follow_are_refused(tmp_path, change, config, message):
    folder = make_gemma4_folder(tmp_path / "m", config_changes=config, **change)
    with pytest.raises(ValueError, match=message):
        image_processor_for(str(folder), None, Tokenizer.from_hf_dir(folder))


def test_a_tokenizer_without_the_image_tokens_is_refused(tmp_path):
    from tiny_models import save_tokenizer

    folder = make_gemma4_folder(tmp_path / "m")
    save_tokenizer(folder, (IMAGE_TOKEN,))
    with pytest.raises(ValueError, match=r"no <\|image> special token"):
        image_processor_for(str(folder), None, Tokenizer.from_hf_dir(folder))


def _mmproj(path, vision: str | None = "gemma4v", audio: str | None = "gemma4a", scale=None,
            mean=(0.0, 0.0, 0.0)):
    """An mmproj GGUF's metadata as llama.cpp's converter (Gemma4VisionAudioModel) writes it
    for an E2B / E4B (vision and audio projectors); no tensors: not read here."""
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_type(gguf.GGUFType.MMPROJ)
    if vision is not None:
        writer.add_clip_has_vision_encoder(True)
        writer.add_vision_image_size(224)  # the converter's dummy
        writer.add_vision_patch_size(16)
        writer.add_vision_image_mean(list(mean))
        writer.add_vision_image_std([1.0, 1.0, 1.0])
        writer.add_clip_vision_projector_type(vision)
        if scale is not None:
            writer.add_vision_projector_scale_factor(scale)
    if audio is not None:
        writer.add_clip_has_audio_encoder(True)
        writer.add_clip_audio_projector_type(audio)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_mmproj_settings_and_refusals(tmp_path):
    tok = Tokenizer.from_hf_dir(make_gemma4_folder(tmp_path / "m"))
    want = Gemma4ImageProcessor(tok.encode_prompt(IMAGE_TOKEN)[0])
    assert image_processor_for("m.gguf", _mmproj(tmp_path / "a.gguf"), tok) == want
    p = image_processor_for("m.gguf", _mmproj(tmp_path / "b.gguf", audio=None, scale=2,
                                              mean=(0.5, 0.5, 0.5)), tok)
    assert p == dataclasses.replace(want, pooling_kernel_size=2, image_mean=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="audio-only mmproj .*'gemma4a'.* images only"):
        image_processor_for("m.gguf", _mmproj(tmp_path / "c.gguf", vision=None), tok)
    with pytest.raises(ValueError, match="'gemma4uv' is not supported"):
        image_processor_for("m.gguf", _mmproj(tmp_path / "d.gguf", "gemma4uv", "gemma4ua"), tok)
