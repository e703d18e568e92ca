"""Qwen2.5-VL and Qwen3.5 images in a chat prompt, and the settings the server reads for them:
`render_chat_images` on weight-free release-like folders (tests/qwen_vl_folders.py: each
family's released chat template, a tokenizer with Qwen's vision specials) giving the
input_ids and pixel_values of transformers' ``Qwen2_5_VLProcessor`` / ``Qwen3VLProcessor``
with ``apply_chat_template``; `image_processor_for` on folders (both spellings of the pixel
limits, architectures alone) and on llama.cpp mmproj GGUFs (metadata as convert_hf_to_gguf.py
writes it); refusals."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
from PIL import Image
from qwen_vl_folders import (
    CLIP_MEAN,
    IMAGE_PAD,
    VISION_END,
    VISION_START,
    hf_image_processor,
    hf_processor,
    make_qwen_vl_folder,
)

from radixserve.frontend.chat_images import render_chat_images
from radixserve.frontend.openai.protocol_chat import ChatCompletionRequest
from radixserve.multimodal.qwen_vl import QwenVLImageProcessor
from radixserve.multimodal.select import image_processor_for
from radixserve.tokenizer.tokenizer import Tokenizer

URL = "data:image/png;base64,AAAA"  # never decoded here: the images are passed in
# small pixel limits (tens of tokens an image), each family in its own spelling
SMALL = {"qwen2.5-vl": {"min_pixels": 3136, "max_pixels": 64 * 28 * 28},
         "qwen3.5": {"size": {"shortest_edge": 4 * 32 * 32, "longest_edge": 48 * 32 * 32}}}


@pytest.fixture(scope="module", params=sorted(SMALL))
def served(request, tmp_path_factory):
    """(family, folder, a serving context with the folder's tokenizer and processor)."""
    family = request.param
    folder = make_qwen_vl_folder(tmp_path_factory.mktemp("qwen") / "hf", family,
                                 **SMALL[family])
    tok = Tokenizer.from_hf_dir(folder)
    ctx = SimpleNamespace(tokenizer=tok, images=image_processor_for(str(folder), None, tok))
    return family, folder, ctx


def _image(seed: int, size=(40, 30), mode="RGB") -> Image.Image:
    rgba = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 4), np.uint8)
    return Image.fromarray(rgba).convert(mode)


def _img(detail: str | None = None) -> dict:
    return {"type": "image_url", "image_url": {"url": URL, "detail": detail}}


def _text(text: str) -> dict:
    return {"type": "text", "text": text}


CONVERSATION = [
    {"role": "user", "content": [_text("What is in"), _img(), _text("and in"), _img("auto")]},
    {"role": "assistant", "content": "Noise, twice."},
    {"role": "user", "content": [_img("high"), _text("  And this one?  ")]},
]


def _hf_expected(family, folder, messages, images):
    """(input_ids, pixel_values, image_grid_thw) as transformers' processor gives them."""
    todo = iter(images)
    hf_messages = [{**m, "content": [{"type": "image", "image": next(todo)}
                                     if p["type"] == "image_url" else p for p in m["content"]]}
                   if isinstance(m["content"], list) else m for m in messages]
    processor = hf_processor(folder, family, **SMALL[family])
    out = processor.apply_chat_template(hf_messages, add_generation_prompt=True, tokenize=True,
                                        return_dict=True, return_tensors="np")
    return out["input_ids"][0].tolist(), out["pixel_values"], out["image_grid_thw"]


def test_render_chat_images_equal_to_transformers(served):
    family, folder, ctx = served
    images = [_image(1, (300, 70)), _image(2, (50, 170), "RGBA"), _image(3, (64, 64), "L")]
    body = ChatCompletionRequest(model="m", messages=CONVERSATION)
    text, ids, inputs = render_chat_images(ctx, body, images)
    want_ids, want_pixels, want_grids = _hf_expected(family, folder, CONVERSATION, images)
    assert ids == want_ids
    assert text.count(VISION_START) == 3 and text.count(IMAGE_PAD) == len(ids) - len(
        ctx.tokenizer.encode_prompt(text.replace(IMAGE_PAD, "")))
    rows = np.concatenate([np.frombuffer(i.pixels, np.float32).reshape(-1, i.shape[-1])
                           for i in inputs])
    np.testing.assert_array_equal(rows, want_pixels)  # bit for bit
    start, end = ctx.tokenizer.encode_prompt(VISION_START + VISION_END)
    merge = ctx.images.merge_size
    for i, (t, h, w) in zip(inputs, want_grids.tolist(), strict=True):
        assert i.shape[:3] == [t, h, w] and i.grid == [t, h // merge, w // merge]
        assert i.length == t * h * w // merge ** 2
        assert ids[i.offset - 1] == start and ids[i.offset + i.length] == end
        assert set(ids[i.offset:i.offset + i.length]) == {ctx.images.image_token_id}


def test_token_caps_in_a_prompt(served):
    """Low detail allows 256 tokens: more than these small limits (no change); the server's
    max_tokens caps each image."""
    _, _, ctx = served
    big = _image(4, (900, 700))
    messages = [{"role": "user", "content": [_img("low"), _img(), _text("Same?")]}]
    body = ChatCompletionRequest(model="m", messages=messages)
    _, _, inputs = render_chat_images(ctx, body, [big, big])
    assert inputs[0].key == inputs[1].key and inputs[0].length > 16
    capped = SimpleNamespace(tokenizer=ctx.tokenizer,
                             images=dataclasses.replace(ctx.images, max_tokens=16))
    _, ids, inputs = render_chat_images(capped, body, [big, big])
    assert all(0 < i.length <= 16 for i in inputs)
    assert ids.count(ctx.images.image_token_id) == sum(i.length for i in inputs)


def test_an_image_pad_typed_in_the_text_is_refused(served):
    _, _, ctx = served
    messages = [{"role": "user", "content": [_text(f"Look: {IMAGE_PAD}"), _img()]}]
    with pytest.raises(ValueError, match=r"holds <\|image_pad\|> 2 times for 1 images"):
        render_chat_images(ctx, ChatCompletionRequest(model="m", messages=messages),
                           [_image(0)])


def test_release_folder_settings(tmp_path):
    """Both releases' preprocessor_config.json, read as transformers reads them."""
    tok = None
    for family, want in (("qwen2.5-vl", (14, 3136, 12845056, tuple(CLIP_MEAN))),
                         ("qwen3.5", (16, 65536, 16777216, (0.5, 0.5, 0.5)))):
        folder = make_qwen_vl_folder(tmp_path / family, family)
        tok = Tokenizer.from_hf_dir(folder)
        p = image_processor_for(str(folder), None, tok)
        assert isinstance(p, QwenVLImageProcessor) and p.family == family
        assert (p.patch_size, p.min_pixels, p.max_pixels, p.image_mean) == want
        assert (p.merge_size, p.temporal_patch_size, p.resample, p.max_tokens) == (2, 2, 3, None)
        config = json.loads((folder / "config.json").read_text())
        assert p.image_token_id == config["image_token_id"] == tok.encode_prompt(IMAGE_PAD)[0]
        hf = hf_image_processor(family)
        assert (hf.size.shortest_edge, hf.size.longest_edge) == want[1:3]


def _rewrite(folder, name, change):
    path = folder / name
    data = {**json.loads(path.read_text()), **change}
    path.write_text(json.dumps({k: v for k, v in data.items() if v is not None}))


def test_other_spellings_and_defaults(tmp_path):
    folder = make_qwen_vl_folder(tmp_path / "m", "qwen3.5")
    tok = Tokenizer.from_hf_dir(folder)
    # min_pixels / max_pixels override size, as transformers' __init__ does
    _rewrite(folder, "preprocessor_config.json", {"min_pixels": 1000, "max_pixels": 90000})
    p = image_processor_for(str(folder), None, tok)
    hf = hf_image_processor("qwen3.5", min_pixels=1000, max_pixels=90000)
    assert (p.min_pixels, p.max_pixels) == (hf.size.shortest_edge, hf.size.longest_edge)
    # the size spelling older transformers saved
    _rewrite(folder, "preprocessor_config.json", {"min_pixels": None, "max_pixels": None,
                                                  "size": {"min_pixels": 5, "max_pixels": 6}})
    assert image_processor_for(str(folder), None, tok).max_pixels == 6
    # architectures alone (the MoE model), no preprocessor config: transformers' defaults,
    # the patch size from vision_config
    _rewrite(folder, "config.json", {"model_type": None,
                                     "architectures": ["Qwen3_5MoeForConditionalGeneration"]})
    (folder / "preprocessor_config.json").unlink()
    p = image_processor_for(str(folder), None, tok)
    assert (p.family, p.patch_size, p.min_pixels, p.max_pixels) == ("qwen3.5", 16, 3136,
                                                                     1003520)


@pytest.mark.parametrize("change, message", [
    ({"do_resize": False}, "do_resize"),
    ({"patch_size": 14}, "patch_size 14 is not the vision encoder's patch_size 16"),
    ({"size": {"height": 64, "width": 64}}, "size must be"),
    ({"size": [65536, 16777216]}, "size must be"),
    ({"resample": 9}, "resample"),
    ({"image_std": [0.5, 0.5]}, "image_std"),
    ({"min_pixels": 10**6, "max_pixels": 10**5}, "is over max_pixels"),
])
def test_settings_it_cannot_follow_are_refused(tmp_path, change, message):
    folder = make_qwen_vl_folder(tmp_path / "m", "qwen3.5", **change)
    with pytest.raises(ValueError, match=message):
        image_processor_for(str(folder), None, Tokenizer.from_hf_dir(folder))


def test_a_tokenizer_without_the_vision_tokens_is_refused(tmp_path):
    from tiny_models import save_tokenizer

    folder = make_qwen_vl_folder(tmp_path / "m", "qwen2.5-vl")
    save_tokenizer(folder, (IMAGE_PAD,))
    with pytest.raises(ValueError, match=r"no <\|vision_start\|> special token"):
        image_processor_for(str(folder), None, Tokenizer.from_hf_dir(folder))


def _mmproj(path, projector, *, patch=14, merge=None, deepstack=None):
    """An mmproj GGUF's metadata as convert_hf_to_gguf.py --mmproj writes it for Qwen2.5-VL
    (Qwen2VLVisionModel) or Qwen3.5 (Qwen3VLVisionModel); no tensors: not read here."""
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_clip_has_vision_encoder(True)
    writer.add_vision_projection_dim(64)
    writer.add_vision_image_size(560 if projector == "qwen2.5vl_merger" else 768)
    writer.add_vision_patch_size(patch)
    writer.add_vision_image_mean(CLIP_MEAN if patch == 14 else [0.5, 0.5, 0.5])
    writer.add_vision_image_std([0.25, 0.5, 0.75])
    writer.add_clip_projector_type(projector)
    if projector == "qwen2.5vl_merger":
        writer.add_vision_use_silu(True)
        writer.add_vision_n_wa_pattern(2)
    else:
        writer.add_vision_use_gelu(True)
        if merge is not None:
            writer.add_vision_spatial_merge_size(merge)
    writer.add_vision_attention_layernorm_eps(1e-6)
    if deepstack is not None:
        writer.add_vision_is_deepstack_layers(deepstack)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_mmproj_settings(tmp_path):
    folder = make_qwen_vl_folder(tmp_path / "m", "qwen2.5-vl")
    tok = Tokenizer.from_hf_dir(folder)
    p = image_processor_for("m.gguf", _mmproj(tmp_path / "a.gguf", "qwen2.5vl_merger"), tok)
    assert (p.family, p.patch_size, p.merge_size, p.min_pixels, p.max_pixels) == (
        "qwen2.5-vl", 14, 2, 3136, 12845056)
    # stored as float32: the same values once the pixels are normalized (in float32)
    assert np.array_equal(np.float32(p.image_mean), np.float32(CLIP_MEAN))
    assert p.image_std == (0.25, 0.5, 0.75)
    assert p.image_token_id == tok.encode_prompt(IMAGE_PAD)[0]
    q = image_processor_for("m.gguf", _mmproj(tmp_path / "b.gguf", "qwen3vl_merger", patch=16,
                                              merge=2, deepstack=[False] * 4), tok)
    assert (q.family, q.patch_size, q.merge_size, q.min_pixels, q.max_pixels) == (
        "qwen3.5", 16, 2, 65536, 16777216)
    assert q.image_mean == (0.5, 0.5, 0.5) and q.resample == 3 and q.temporal_patch_size == 2
    three = _mmproj(tmp_path / "c.gguf", "qwen3vl_merger", patch=16, merge=3)
    assert image_processor_for("m.gguf", three, tok).merge_size == 3
    qwen3_vl = _mmproj(tmp_path / "d.gguf", "qwen3vl_merger", patch=16,
                       deepstack=[True, False, True, False])
    r = image_processor_for("m.gguf", qwen3_vl, tok)  # deepstack layers: Qwen3-VL's
    assert (r.family, r.patch_size, r.merge_size, r.min_pixels, r.max_pixels) == (
        "qwen3-vl", 16, 2, 65536, 16777216)
    with pytest.raises(ValueError, match="'qwen2vl_merger' is not supported"):
        image_processor_for("m.gguf", _mmproj(tmp_path / "e.gguf", "qwen2vl_merger"), tok)
