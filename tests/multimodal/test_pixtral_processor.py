"""Mistral 3 image preprocessing and prompt (radixserve/multimodal/pixtral.py) against
transformers: pixels bit for bit equal to the slow ``PixtralImageProcessorPil`` as
``PixtralProcessor`` runs it (patch size = patch * merge) for every kind of image, at the
release settings and at small ones; token grids equal to its ``image_sizes`` and the
processor's token counts; ``detail`` and ``max_tokens`` caps; prompt ids equal to
``PixtralProcessor.apply_chat_template``'s on a weight-free release-like folder
(tests/pixtral_image_folders.py); the settings of folders and llama.cpp mmproj files;
refusals."""

from __future__ import annotations

import dataclasses
import io
import subprocess
import sys
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
from PIL import Image
from pixtral_image_folders import (
    BREAK_TOKEN,
    END_TOKEN,
    IMAGE_TOKEN,
    hf_image_processor,
    hf_processor,
    make_mistral3_folder,
)

from radixserve.frontend.chat_images import render_chat_images
from radixserve.frontend.openai.protocol_chat import ChatCompletionRequest
from radixserve.multimodal.pixtral import LOW_DETAIL_TOKENS, PixtralImageProcessor, fit
from radixserve.multimodal.select import image_processor_for, with_max_tokens
from radixserve.tokenizer.tokenizer import Tokenizer

OURS = PixtralImageProcessor(7)  # the releases' settings
# small settings: 8 px tokens, a 64 px edge, another filter, mean and std
SMALL = PixtralImageProcessor(7, patch_size=4, merge_size=2, longest_edge=64, resample=2,
                              image_mean=(0.5, 0.25, 0.0), image_std=(0.5, 2.0, 1.0))
SMALL_HF = {"size": {"longest_edge": 64}, "patch_size": 4, "resample": 2,
            "image_mean": [0.5, 0.25, 0.0], "image_std": [0.5, 2.0, 1.0]}


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
    Image.fromarray(rgb).save(data, "JPEG", quality=80)
    return Image.open(io.BytesIO(data.getvalue()))


IMAGES = {  # modes; thin, tiny, odd, exact and huge sizes; both orientations
    "rgb": lambda: Image.fromarray(_noise((37, 53, 3))),
    "rgba_transparent": _alpha_gradient,
    "grayscale_L": lambda: Image.fromarray(_noise((300, 500), 2)),
    "palette_P_transparency": _palette,
    "cmyk": lambda: Image.fromarray(_noise((33, 44, 3), 6)).convert("CMYK"),
    "thin_1x150": lambda: Image.fromarray(_noise((1, 150, 3), 7)),
    "thin_190x1": lambda: Image.fromarray(_noise((190, 1, 3), 8)),
    "tiny_1x1": lambda: Image.fromarray(_noise((1, 1, 3), 14)),
    "tiny_10x10": lambda: Image.fromarray(_noise((10, 10, 3), 9)),
    "odd_333x517": lambda: Image.fromarray(_noise((333, 517, 3), 10)),
    "exact_1540x1540": lambda: Image.fromarray(_noise((1540, 1540, 3), 15)),  # kept as is
    "huge_3000x4000": lambda: Image.fromarray(_noise((3000, 4000, 3), 11)),
    "tall_2500x700": lambda: Image.fromarray(_noise((2500, 700, 3), 12)),
    "jpeg_no_exif": _jpeg,
}


def _check_equal(ours: PixtralImageProcessor, hf, image: Image.Image, detail=None):
    """``ours`` gives transformers' pixels and token grid for ``image`` (``hf`` called with
    the processor's patch size, one token's side, as PixtralProcessor calls it)."""
    before = image.tobytes()
    got = ours.process(image, detail=detail)
    assert image.tobytes() == before  # the caller's image is left alone
    out = hf(image, return_tensors="np", patch_size=ours.side)
    (height, width), = out["image_sizes"].tolist()
    assert got.pixels.dtype == np.float32 and got.pixels.flags.c_contiguous
    np.testing.assert_array_equal(got.pixels, out["pixel_values"][0])  # bit for bit
    rows, cols = height // ours.side, width // ours.side
    assert got.grid == (1, rows, cols) and got.num_tokens == rows * cols
    assert got.row_breaks and len(got.key) == 32
    return got


def _transformers_size(image: Image.Image, edge: int, side: int) -> tuple[int, int]:
    from transformers.models.pixtral.image_processing_pil_pixtral import (
        get_resize_output_image_size,
    )

    return get_resize_output_image_size(np.zeros((3, image.height, image.width)), (edge, edge),
                                        (side, side), "channels_first")


@pytest.mark.parametrize("settings", ["release", "small"])
@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_pixels_equal_to_transformers_slow_processor(kind, settings):
    ours, changes = (OURS, {}) if settings == "release" else (SMALL, SMALL_HF)
    image, hf = IMAGES[kind](), hf_image_processor(**changes)
    if 0 in _transformers_size(image, ours.longest_edge, ours.side):
        with pytest.raises(ValueError):  # too thin for transformers: one token across here
            hf(image, return_tensors="np", patch_size=ours.side)
        assert 1 in ours.process(image).grid[1:]
        return
    got = _check_equal(ours, hf, image)
    _, rows, cols = got.grid
    assert max(rows, cols) * ours.side <= -(-ours.longest_edge // ours.side) * ours.side


def test_token_counts_equal_to_the_processor(tmp_path):
    processor = hf_processor(make_mistral3_folder(tmp_path / "m"))
    sizes = [(IMAGES[k]().height, IMAGES[k]().width) for k in sorted(IMAGES)]
    want = processor._get_num_multimodal_tokens(image_sizes=sizes)["num_image_tokens"]
    assert [OURS.process(IMAGES[k]()).num_tokens for k in sorted(IMAGES)] == want
    assert OURS.process(IMAGES["exact_1540x1540"]()).grid == (1, 55, 55)


def test_sizes_against_transformers_for_many_shapes():
    from transformers.models.pixtral.image_processing_pil_pixtral import (
        get_resize_output_image_size,
    )

    rng = np.random.default_rng(5)
    sizes = [(1, 1), (1, 1540), (1540, 1), (27, 28), (28, 28), (2, 3), (20, 3000), (1541, 2)]
    sizes += [tuple(int(v) for v in rng.integers(1, 6000, 2)) for _ in range(400)]
    for edge, side in ((1540, 28), (1024, 16), (64, 8), (448, 28)):
        for h, w in sizes:
            want = get_resize_output_image_size(np.zeros((3, h, w)), (edge, edge), (side, side),
                                                input_data_format="channels_first")
            if min(want) == 0:  # transformers floors an edge to nothing; here it is 1 pixel
                assert fit(h, w, edge, side) == tuple(v or side for v in want)
            else:
                assert fit(h, w, edge, side) == want


def test_an_image_too_thin_for_transformers_gets_one_token_across():
    image = Image.fromarray(_noise((1, 3100, 3), 16))
    with pytest.raises(ValueError):  # Pillow refuses transformers' 0-pixel height
        hf_image_processor()(image, return_tensors="np", patch_size=28)
    got = OURS.process(image)
    assert got.grid == (1, 1, 55) and got.pixels.shape == (3, 28, 1540)


def test_detail_low_and_max_tokens_cap_the_tokens():
    for kind in ("huge_3000x4000", "tall_2500x700", "odd_333x517", "thin_1x150"):
        image = IMAGES[kind]()
        for cap, detail in ((None, "low"), (100, None), (100, "low"), (1000, "low"), (7, None),
                            (1, None)):
            ours = dataclasses.replace(OURS, max_tokens=cap)
            limit = min(c for c in (cap, LOW_DETAIL_TOKENS if detail else None) if c)
            edge = ours.edge(image.height, image.width, detail)
            if 0 in _transformers_size(image, edge, 28):  # too thin for transformers
                assert ours.process(image, detail).num_tokens <= limit
                continue
            got = _check_equal(ours, hf_image_processor(size={"longest_edge": edge}), image,
                               detail)
            assert got.num_tokens <= limit
            if edge < ours.longest_edge:  # the largest edge within the cap
                h, w = fit(image.height, image.width, edge + 1, ours.side)
                assert (h // ours.side) * (w // ours.side) > limit
            else:
                assert got.key == OURS.process(image).key
    huge = IMAGES["huge_3000x4000"]()
    # 4:3 at 256 tokens: edge 504, 378 -> 392 x 504 px (edge 505 gives 14 x 19 = 266)
    assert OURS.process(huge, detail="low").grid == (1, 14, 18)
    assert {OURS.process(huge, detail=d).key for d in ("high", "auto", None)} == {
        OURS.process(huge).key}
    assert OURS.process(huge).grid == (1, 42, 55)  # 1155 -> 1176 x 1540 px
    thin = Image.fromarray(_noise((1, 3100, 3), 16))  # past transformers: one row of <= cap
    assert dataclasses.replace(OURS, max_tokens=10).process(thin).grid == (1, 1, 10)


def test_names_keys_and_prompt_text():
    rgb = Image.fromarray(_noise((40, 60, 3), 11))
    first, again = OURS.process(rgb), OURS.process(rgb.convert("RGBA"))  # opaque: same pixels
    assert first.key == again.key
    assert OURS.process(Image.fromarray(_noise((40, 60, 3), 12))).key != first.key
    assert OURS.name == ("pixtral/patch14/merge2/resample3/scale0.00392156862745098"
                         "/mean[0.48145466, 0.4578275, 0.40821073]"
                         "/std[0.26862954, 0.26130258, 0.27577711]")
    other = dataclasses.replace(OURS, resample=2)
    assert other.name != OURS.name and other.process(rgb).key != first.key
    assert OURS.placeholder == IMAGE_TOKEN and first.grid == (1, 2, 3)
    row = IMAGE_TOKEN * 3
    assert OURS.expand(first) == row + BREAK_TOKEN + row + END_TOKEN
    one = OURS.process(IMAGES["tiny_1x1"]())
    assert OURS.expand(one) == IMAGE_TOKEN + END_TOKEN


@pytest.mark.parametrize("size", [(0, 5), (5, 0), (0, 0)])
def test_empty_images_are_refused(size):
    with pytest.raises(ValueError, match="empty"):
        OURS.process(Image.new("RGB", size))


@pytest.mark.parametrize("change, message", [
    ({"patch_size": 0}, "patch_size must be a positive integer"),
    ({"merge_size": True}, "merge_size must be a positive integer"),
    ({"longest_edge": None}, "longest_edge must be a positive integer"),
    ({"max_tokens": 0}, "max_tokens must be a positive integer"),
    ({"rescale_factor": "x"}, "rescale_factor must be a positive number"),
])
def test_bad_settings_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(OURS, **change)


def test_the_module_loads_no_torch():
    code = ("import sys, radixserve.multimodal.pixtral as p, radixserve.multimodal.select;"
            " from PIL import Image; p.PixtralImageProcessor(1).process(Image.new('RGB', (9, 7)));"
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
    {"role": "system", "content": "Look closely."},
    {"role": "user", "content": [_text("What is in"), _img(), _text("and in"), _img("auto")]},
    {"role": "assistant", "content": "Noise, twice."},
    {"role": "user", "content": [_text("  And this one?  "), _img("high")]},  # sorted: image 1st
]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(folder, a serving context with the folder's tokenizer and processor)."""
    folder = make_mistral3_folder(tmp_path_factory.mktemp("mistral3") / "hf")
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
    want = hf_processor(folder).apply_chat_template(
        hf_messages, add_generation_prompt=True, tokenize=True, return_dict=True,
        return_tensors="np")
    assert ids == want["input_ids"][0].tolist()
    assert text.count(END_TOKEN) == 3 and text.index("[/INST]") > text.index(END_TOKEN)
    brk, end = ctx.tokenizer.encode_prompt(BREAK_TOKEN + END_TOKEN)
    img = ctx.images.image_token_id
    for n, (i, (height, width)) in enumerate(zip(inputs, want["image_sizes"].tolist(),
                                                 strict=True)):
        _, rows, cols = i.grid
        assert (rows, cols) == (height // 28, width // 28) and i.row_breaks
        assert i.shape == [3, height, width] and i.length == rows * (cols + 1)
        span = ids[i.offset:i.offset + i.length]
        assert span == ([img] * cols + [brk]) * (rows - 1) + [img] * cols + [end]
        pixels = np.frombuffer(i.pixels, np.float32).reshape(i.shape)
        # bit for bit (transformers pads its batch to the largest image)
        np.testing.assert_array_equal(pixels, want["pixel_values"][n][:, :height, :width])


def test_an_image_token_typed_in_the_text_is_refused(served):
    _, ctx = served
    messages = [{"role": "user", "content": [_text(f"Look: {IMAGE_TOKEN}"), _img(), _text("!")]}]
    with pytest.raises(ValueError, match=r"holds \[IMG\] 2 times for 1 images"):
        render_chat_images(ctx, ChatCompletionRequest(model="m", messages=messages),
                           [IMAGES["rgb"]()])


def test_folder_settings(tmp_path):
    for i, preprocessor_file in enumerate((False, True)):
        folder = make_mistral3_folder(tmp_path / str(i), preprocessor_file=preprocessor_file)
        tok = Tokenizer.from_hf_dir(folder)
        p = image_processor_for(str(folder), None, tok)
        assert p == PixtralImageProcessor(tok.encode_prompt(IMAGE_TOKEN)[0])
        assert with_max_tokens(p, 64).max_tokens == 64  # --image-max-tokens
    # transformers' defaults where the files say nothing; the architecture alone names it
    folder = make_mistral3_folder(
        tmp_path / "bare", size=None, resample=None, image_mean=None, image_std=None,
        rescale_factor=None, processor_changes={"patch_size": None, "spatial_merge_size": None},
        config_changes={"model_type": None, "spatial_merge_size": None, "vision_config": {}})
    p = image_processor_for(str(folder), None, Tokenizer.from_hf_dir(folder))
    hf = hf_image_processor(size=None, resample=None, image_mean=None, image_std=None,
                            rescale_factor=None)
    assert (p.longest_edge, p.resample, p.rescale_factor) == (
        hf.size["longest_edge"], hf.resample, hf.rescale_factor)
    assert (list(p.image_mean), list(p.image_std)) == (list(hf.image_mean), list(hf.image_std))
    assert (p.patch_size, p.merge_size) == (14, 2)  # Mistral3Config's
    # config.json's sizes where processor_config.json does not say them
    folder = make_mistral3_folder(
        tmp_path / "sizes", processor_changes={"patch_size": None, "spatial_merge_size": None},
        config_changes={"spatial_merge_size": 1, "vision_config": {"patch_size": 16}})
    p = image_processor_for(str(folder), None, Tokenizer.from_hf_dir(folder))
    assert (p.patch_size, p.merge_size, p.side) == (16, 1, 16)


@pytest.mark.parametrize("change, processor, config, message", [
    ({"do_resize": False}, None, None, "do_resize: false is not supported"),
    ({"do_normalize": False}, None, None, "do_normalize: false is not supported"),
    ({"do_center_crop": True}, None, None, "do_center_crop is not supported"),
    ({"size": {"height": 10, "width": 10}}, None, None, "size must be {longest_edge"),
    ({"resample": 9}, None, None, "resample"),
    ({"rescale_factor": "x"}, None, None, "rescale_factor"),
    ({"image_std": [0.5, 0.5]}, None, None, "image_std"),
    ({}, {"spatial_merge_size": 1}, None, "spatial_merge_size 1 is not config.json's 2"),
    ({}, {"patch_size": 16}, None, "patch_size 16 is not config.json's 14"),
    ({}, {"image_end_token": 5}, None, "image tokens must be strings"),
    ({}, {"image_end_token": "[IMG_STOP]"}, None, r"no \[IMG_STOP\] special token"),
    ({}, None, {"image_token_index": 3}, r"image_token_index 3 is not the tokenizer's \[IMG\]"),
])
def test_settings_it_cannot_follow_are_refused(tmp_path, change, processor, config, message):
    folder = make_mistral3_folder(tmp_path / "m", processor_changes=processor,
                                  config_changes=config, **change)
    with pytest.raises(ValueError, match=message):
        image_processor_for(str(folder), None, Tokenizer.from_hf_dir(folder))


def test_a_tokenizer_without_the_image_tokens_is_refused(tmp_path):
    from tiny_models import save_tokenizer

    folder = make_mistral3_folder(tmp_path / "m")
    save_tokenizer(folder, (IMAGE_TOKEN, END_TOKEN))
    with pytest.raises(ValueError, match=r"no \[IMG_BREAK\] special token"):
        image_processor_for(str(folder), None, Tokenizer.from_hf_dir(folder))


def _mmproj(path, projector="pixtral", merge: int | None = 2, preproc: int | None = None):
    """An mmproj GGUF's metadata as llama.cpp's converter (LlavaVisionModel) writes it for
    Mistral 3; no tensors: not read here."""
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_clip_has_vision_encoder(True)
    writer.add_vision_image_size(1540)
    writer.add_vision_patch_size(14)
    writer.add_vision_image_mean([0.48145466, 0.4578275, 0.40821073])
    writer.add_vision_image_std([0.26862954, 0.26130258, 0.27577711])
    writer.add_clip_projector_type(projector)
    if merge is not None:
        writer.add_vision_spatial_merge_size(merge)
    if preproc is not None:
        writer.add_vision_preproc_image_size(preproc)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_mmproj_settings_and_refusals(tmp_path):
    tok = Tokenizer.from_hf_dir(make_mistral3_folder(tmp_path / "m"))
    p = image_processor_for("m.gguf", _mmproj(tmp_path / "a.gguf"), tok)
    # the file's mean and std are float32: the same pixels (normalize works in float32)
    assert np.float32(p.image_mean).tolist() == np.float32(OURS.image_mean).tolist()
    assert np.float32(p.image_std).tolist() == np.float32(OURS.image_std).tolist()
    want = PixtralImageProcessor(tok.encode_prompt(IMAGE_TOKEN)[0], image_mean=p.image_mean,
                                 image_std=p.image_std)
    assert p == want
    image = IMAGES["odd_333x517"]()
    np.testing.assert_array_equal(p.process(image).pixels, OURS.process(image).pixels)
    p = image_processor_for("m.gguf", _mmproj(tmp_path / "b.gguf", merge=None, preproc=1024),
                            tok)
    assert p == dataclasses.replace(want, merge_size=1, longest_edge=1024)
    bare = {"clip.projector_type": "pixtral", "clip.vision.spatial_merge_size": 2}
    from radixserve.multimodal.pixtral import from_mmproj

    assert from_mmproj(bare, tok) == PixtralImageProcessor(want.image_token_id)  # the defaults
    with pytest.raises(ValueError, match="patch_size must be a positive integer"):
        from_mmproj({**bare, "clip.vision.patch_size": 0}, tok)
    with pytest.raises(ValueError, match="'lightonocr' is not supported"):
        image_processor_for("m.gguf", _mmproj(tmp_path / "c.gguf", "lightonocr"), tok)

    with pytest.raises(ValueError, match="'gemma3' is not Mistral 3's vision projector"):
        from_mmproj({"clip.projector_type": "gemma3"}, tok)
    from tiny_models import save_tokenizer

    save_tokenizer(tmp_path / "t")  # the tiny tokenizer alone: no image tokens
    text_only = Tokenizer.from_hf_dir(tmp_path / "t")
    with pytest.raises(ValueError, match=r"no \[IMG\] special token"):
        image_processor_for("m.gguf", _mmproj(tmp_path / "d.gguf"), text_only)
