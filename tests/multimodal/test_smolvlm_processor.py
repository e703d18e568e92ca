"""SmolVLM's image preprocessing and prompt (radixserve/multimodal/smolvlm.py) against
transformers: the tiles bit for bit equal to the slow ``SmolVLMImageProcessor`` (the Pillow
backend) for every kind of image, and `render_chat_images` on the tiny SmolVLM folder
(tests/tiny_smolvlm.py: a release's chat template and files) giving the input_ids and
pixel_values of ``SmolVLMProcessor``: its ``apply_chat_template`` text with each ``<image>``
replaced as its ``replace_image_token`` does (transformers' ``get_image_prompt_string`` with the
image processor's rows and cols), tokenized by the folder's tokenizer. (``SmolVLMProcessor``
itself cannot be built here: its video processor needs torchvision.) Then one `ImageInput` per
tile, the folder and mmproj settings, and refusals."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
from PIL import Image
from tiny_smolvlm import (
    CHAT_TEMPLATE,
    FAKE,
    GLOBAL,
    IMAGE,
    MAX_GRID,
    PREPROCESSOR,
    TILE,
    TOKENS_PER_TILE,
    make_smolvlm_hf,
)
from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil
from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

from radixserve.frontend.chat_images import render_chat_images
from radixserve.frontend.openai.protocol_chat import ChatCompletionRequest
from radixserve.multimodal.prompt import place_images
from radixserve.multimodal.select import image_processor_for
from radixserve.multimodal.smolvlm import SmolVLMImageProcessor
from radixserve.tokenizer.tokenizer import Tokenizer

URL = "data:image/png;base64,AAAA"  # never decoded here: the images are passed in


def _noise(shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _alpha_gradient() -> Image.Image:
    alpha = np.tile(np.linspace(0, 255, 80).astype(np.uint8), (50, 1))[..., None]
    return Image.fromarray(np.concatenate([_noise((50, 80, 3), 1), alpha], axis=-1))


def _palette() -> Image.Image:
    image = Image.fromarray(_noise((40, 70, 3), 3)).convert("P", palette=Image.Palette.ADAPTIVE)
    image.info["transparency"] = int(np.asarray(image)[0, 0])
    return image


IMAGES = {  # modes, and sizes from one tile to the most, both orientations, both bounds
    "rgb": lambda: Image.fromarray(_noise((37, 53, 3))),
    "rgba_transparent": _alpha_gradient,
    "grayscale_L": lambda: Image.fromarray(_noise((300, 500), 2)),
    "palette_P_transparency": _palette,
    "cmyk": lambda: Image.fromarray(_noise((33, 44, 3), 6)).convert("CMYK"),
    "tiny_3x5": lambda: Image.fromarray(_noise((5, 3, 3), 7)),
    "huge_aspect_wide": lambda: Image.fromarray(_noise((7, 2400, 3), 8)),
    "huge_aspect_tall": lambda: Image.fromarray(_noise((1900, 9, 3), 9)),
    "large_downscale": lambda: Image.fromarray(_noise((1200, 1600, 3), 10)),
    "square": lambda: Image.fromarray(_noise((64, 64, 3), 11)),
    "beyond_4096": lambda: Image.fromarray(_noise((3, 5000, 3), 12)),
}


def _hf(**change) -> SmolVLMImageProcessorPil:
    skip = {"image_processor_type", "processor_class"}
    return SmolVLMImageProcessorPil(**{k: v for k, v in {**PREPROCESSOR, **change}.items()
                                       if k not in skip})


def _hf_tiles(hf: SmolVLMImageProcessorPil, image: Image.Image, **kwargs):
    """(the pixel tiles, the prompt text) of one image, as SmolVLMProcessor makes them."""
    out = hf(image, return_tensors="np", return_row_col_info=True, **kwargs)
    text = get_image_prompt_string(out["rows"][0][0], out["cols"][0][0], TOKENS_PER_TILE,
                                   fake_token_around_image=FAKE, image_token=IMAGE,
                                   global_image_token=GLOBAL)
    return out["pixel_values"][0], text


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_smolvlm_hf(tmp_path_factory.mktemp("smolvlm") / "hf")


@pytest.fixture(scope="module")
def ctx(folder):
    tok = Tokenizer.from_hf_dir(folder)
    return SimpleNamespace(tokenizer=tok, images=image_processor_for(str(folder), None, tok))


RELEASE = SmolVLMImageProcessor(image_token_id=7, tokens_per_tile=TOKENS_PER_TILE,
                                tile_size=TILE, longest_edge=MAX_GRID * TILE)


@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_tiles_equal_to_transformers_slow_processor(kind):
    image = IMAGES[kind]()
    before = image.tobytes()
    got = RELEASE.process_tiles(image, detail="high")
    assert image.tobytes() == before  # the caller's image is left alone
    want, text = _hf_tiles(_hf(), image)
    pixels = np.stack([t.pixels for t in got.tiles])
    assert all(t.pixels.dtype == np.float32 and t.pixels.flags.c_contiguous for t in got.tiles)
    assert pixels.shape == want.shape and pixels.shape[1:] == (3, TILE, TILE)
    np.testing.assert_array_equal(pixels, want)  # bit for bit, not within a tolerance
    assert got.text == text
    assert {t.num_tokens for t in got.tiles} == {TOKENS_PER_TILE}


@pytest.mark.parametrize("kind", ["rgb", "huge_aspect_tall", "large_downscale", "tiny_3x5"])
def test_low_detail_and_splitting_off_give_the_global_tile_alone(kind):
    image = IMAGES[kind]()
    want, text = _hf_tiles(_hf(), image, do_image_splitting=False)
    unsplit = SmolVLMImageProcessor(7, TOKENS_PER_TILE, TILE, MAX_GRID * TILE,
                                    do_image_splitting=False)
    for got in (RELEASE.process_tiles(image, detail="low"), unsplit.process_tiles(image)):
        assert len(got.tiles) == 1 and got.text == text == f"{FAKE}{GLOBAL}" + (
            IMAGE * TOKENS_PER_TILE) + FAKE
        np.testing.assert_array_equal(got.tiles[0].pixels, want[0])


def test_an_image_of_one_tile_is_not_split():
    """Longest edge = one tile: splitting on, yet only the global tile (rows = cols = 0)."""
    ours = SmolVLMImageProcessor(7, TOKENS_PER_TILE, TILE, TILE)
    image = IMAGES["rgba_transparent"]()
    got = ours.process_tiles(image)
    want, text = _hf_tiles(_hf(size={"longest_edge": TILE}), image)
    assert len(got.tiles) == 1 and got.text == text and "<row_" not in text
    np.testing.assert_array_equal(got.tiles[0].pixels, want[0])


def test_keys_name_each_tiles_pixels():
    tiles = RELEASE.process_tiles(IMAGES["large_downscale"]()).tiles
    assert len(tiles) == MAX_GRID * MAX_GRID + 1  # 1600 x 1200 -> 192 x 144 -> 3 x 3, + global
    assert all(len(t.key) == 32 for t in tiles) and len({t.key for t in tiles}) == len(tiles)
    again = RELEASE.process_tiles(IMAGES["large_downscale"]()).tiles
    assert [t.key for t in again] == [t.key for t in tiles]


def _img(detail: str | None = None) -> dict:
    return {"type": "image_url", "image_url": {"url": URL, "detail": detail}}


def _text(text: str) -> dict:
    return {"type": "text", "text": text}


def _hf_expected(folder, messages: list[dict], images: list[Image.Image]):
    """(text, input_ids, pixel tiles) as SmolVLMProcessor gives them (module docstring)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    hf_messages = [{**m, "content": [{"type": "image"} if p["type"] == "image_url" else p
                                     for p in m["content"]]}
                   if isinstance(m["content"], list) else m for m in messages]
    text = tok.apply_chat_template(hf_messages, chat_template=CHAT_TEMPLATE, tokenize=False,
                                   add_generation_prompt=True)
    pieces = text.split(IMAGE)
    assert len(pieces) == len(images) + 1
    details = [p["image_url"]["detail"] for m in messages if isinstance(m["content"], list)
               for p in m["content"] if p["type"] == "image_url"]
    expanded, tiles = pieces[0], []
    for image, detail, piece in zip(images, details, pieces[1:]):
        pixels, image_text = _hf_tiles(_hf(), image, do_image_splitting=detail != "low")
        expanded += image_text + piece
        tiles.append(pixels)
    ids = tok(expanded, add_special_tokens=False)["input_ids"]
    return expanded, ids, np.concatenate(tiles)


def _image(seed: int, size=(40, 30), mode="RGB") -> Image.Image:
    rgba = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 4), np.uint8)
    return Image.fromarray(rgba).convert(mode)


CONVERSATION = [
    {"role": "user", "content": [_text("What is in"), _img(), _text("and in"), _img("low")]},
    {"role": "user", "content": [_img("high"), _text("  And this one?  ")]},
]


def test_render_chat_images_equal_to_transformers(folder, ctx):
    images = [_image(1, (300, 70)), _image(2, (50, 170), "RGBA"), _image(1, (64, 64), "L")]
    body = ChatCompletionRequest(model="m", messages=CONVERSATION)
    text, ids, inputs = render_chat_images(ctx, body, images)
    want_text, want_ids, want_pixels = _hf_expected(folder, CONVERSATION, images)
    assert (text, ids) == (want_text, want_ids)
    pixels = np.stack([np.frombuffer(i.pixels, np.float32).reshape(i.shape) for i in inputs])
    np.testing.assert_array_equal(pixels, want_pixels)  # bit for bit
    # one ImageInput per tile: 1 x 3 + global, the low-detail global alone, 3 x 3 + global
    assert len(inputs) == 4 + 1 + 10
    assert {(i.length, tuple(i.shape)) for i in inputs} == {(TOKENS_PER_TILE, (3, TILE, TILE))}
    fake, glob, image_id, row33 = ctx.tokenizer.encode_prompt(f"{FAKE}{GLOBAL}{IMAGE}<row_3_col_3>")
    assert ctx.images.image_token_id == image_id
    before = [ids[i.offset - 1] for i in inputs]
    assert before[3] == before[4] == before[-1] == glob and before[-2] == row33
    assert all(ids[i.offset + i.length] in (fake, ctx.tokenizer.encode_prompt("\n")[0])
               for i in inputs)
    assert all(set(ids[i.offset:i.offset + i.length]) == {image_id} for i in inputs)
    assert [i.offset for i in inputs] == sorted(i.offset for i in inputs)
    assert sum(t == image_id for t in ids) == 15 * TOKENS_PER_TILE


def test_a_text_only_turn_keeps_its_text(folder, ctx):
    messages = [CONVERSATION[0], {"role": "assistant", "content": [_text("Noise.")]},
                {"role": "user", "content": "Sure?"}]
    images = [_image(1), _image(2)]
    text, _, _ = render_chat_images(ctx, ChatCompletionRequest(model="m", messages=messages),
                                    images)
    assert "Assistant: Noise.<end_of_utterance>" in text and "User: Sure?" in text


def test_an_image_token_typed_in_the_text_is_refused(ctx):
    messages = [{"role": "user", "content": [_text(f"Look: {IMAGE}"), _img()]}]
    with pytest.raises(ValueError, match="holds <image> 2 times for 1 images"):
        render_chat_images(ctx, ChatCompletionRequest(model="m", messages=messages), [_image(0)])
    with pytest.raises(ValueError, match="runs of image tokens"):  # an <image> run in a tile
        place_images(f"{IMAGE}", [_image(0)], [None], ctx.images,
                     lambda text: ctx.tokenizer.encode_prompt(text.replace(FAKE, IMAGE, 1)))


def test_the_folder_settings(folder, ctx):
    p = ctx.images
    assert isinstance(p, SmolVLMImageProcessor)
    assert (p.tile_size, p.longest_edge, p.tokens_per_tile, p.resample) == (
        TILE, MAX_GRID * TILE, TOKENS_PER_TILE, 1)
    assert p.do_image_splitting and p.image_mean == p.image_std == (0.5, 0.5, 0.5)
    assert p.image_token_id == json.loads((folder / "config.json").read_text())["image_token_id"]


@pytest.mark.parametrize("change, message", [
    ({"max_image_size": {"longest_edge": 2 * TILE}}, "not the vision encoder's image_size"),
    ({"max_image_size": {"height": TILE, "width": TILE}}, "max_image_size must be"),
    ({"size": {"longest_edge": 0}}, "size must be"),
    ({"do_resize": False}, "do_resize"),
    ({"resample": 9}, "resample"),
    ({"image_std": [0.5, 0.5]}, "image_std"),
])
def test_settings_it_cannot_follow_are_refused(folder, ctx, tmp_path, change, message):
    copy = shutil.copytree(folder, tmp_path / "m", ignore=shutil.ignore_patterns("*.safetensors"))
    (copy / "preprocessor_config.json").write_text(json.dumps({**PREPROCESSOR, **change}))
    with pytest.raises(ValueError, match=message):
        image_processor_for(str(copy), None, ctx.tokenizer)


def test_a_token_count_other_than_the_encoders_is_refused(folder, ctx, tmp_path):
    copy = shutil.copytree(folder, tmp_path / "m", ignore=shutil.ignore_patterns("*.safetensors"))
    (copy / "processor_config.json").write_text(json.dumps({"image_seq_len": 64}))
    with pytest.raises(ValueError, match="image_seq_len 64 is not the 16 tokens per tile"):
        image_processor_for(str(copy), None, ctx.tokenizer)


def _mmproj(path, *, patch_size=8, scale=2, preproc=MAX_GRID * TILE):
    """An mmproj GGUF's metadata as convert_hf_to_gguf.py --mmproj writes it for SmolVLM
    (MmprojModel.set_gguf_parameters + SmolVLMModel's; no tensors: not read here)."""
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_clip_has_vision_encoder(True)
    writer.add_vision_image_size(TILE)
    writer.add_vision_patch_size(patch_size)
    writer.add_vision_image_mean([0.5, 0.5, 0.5])
    writer.add_vision_image_std([0.25, 0.5, 0.75])
    writer.add_clip_projector_type(gguf.VisionProjectorType.IDEFICS3)
    writer.add_vision_projector_scale_factor(scale)
    if preproc is not None:
        writer.add_vision_preproc_image_size(preproc)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_an_idefics3_mmproj(ctx, tmp_path):
    p = image_processor_for("model.gguf", _mmproj(tmp_path / "mmproj.gguf"), ctx.tokenizer)
    assert isinstance(p, SmolVLMImageProcessor)
    assert (p.tile_size, p.longest_edge, p.tokens_per_tile, p.resample) == (
        TILE, MAX_GRID * TILE, TOKENS_PER_TILE, 1)
    assert p.image_std == (0.25, 0.5, 0.75) and p.do_image_splitting
    old = image_processor_for("m.gguf", _mmproj(tmp_path / "old.gguf", scale=4, preproc=None),
                              ctx.tokenizer)
    assert (old.longest_edge, old.tokens_per_tile) == (4 * TILE, 4)  # the releases' ratio
    with pytest.raises(ValueError, match="not a multiple of patch_size 8 x scale_factor 3"):
        image_processor_for("m.gguf", _mmproj(tmp_path / "bad.gguf", scale=3), ctx.tokenizer)


def test_a_tokenizer_without_the_tile_tokens_is_refused(tmp_path):
    from tiny_models import save_tokenizer

    save_tokenizer(tmp_path, (IMAGE,))  # no <fake_token_around_image>
    with pytest.raises(ValueError, match="no <fake_token_around_image> special token"):
        image_processor_for("m.gguf", _mmproj(tmp_path / "mmproj.gguf"),
                            Tokenizer.from_hf_dir(tmp_path))


def test_the_module_loads_no_torch():
    code = "import sys, radixserve.multimodal.smolvlm; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False"]
