"""`render_chat_images` (radixserve/frontend/chat_images.py) on the tiny Gemma 3 VLM folder
(Gemma 3's released chat template, a tokenizer with its image tokens): the same input_ids and
pixel_values as transformers' ``Gemma3Processor`` (slow image processor) with
``apply_chat_template`` for the same messages, the spans of the image tokens, and refusals."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image
from tiny_gemma3_vlm import BOI, CHAT_TEMPLATE, EOI, IMAGE_TOKEN, make_gemma3_vlm_hf

from radixserve.frontend.chat_images import render_chat_images
from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.openai.protocol_chat import ChatCompletionRequest
from radixserve.frontend.openai.chat_render import render_messages
from radixserve.multimodal.select import image_processor_for
from radixserve.tokenizer.tokenizer import Tokenizer

URL = "data:image/png;base64,AAAA"  # never decoded here: the images are passed in


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(a serving context with the folder's tokenizer and processor, transformers' processor)."""
    from transformers import AutoProcessor

    folder = make_gemma3_vlm_hf(tmp_path_factory.mktemp("g3") / "hf")
    tok = Tokenizer.from_hf_dir(folder)
    ctx = SimpleNamespace(tokenizer=tok, images=image_processor_for(str(folder), None, tok))
    return ctx, AutoProcessor.from_pretrained(str(folder), backend="pil")


def _image(seed: int, size=(40, 30), mode="RGB") -> Image.Image:
    rgba = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 4), np.uint8)
    return Image.fromarray(rgba).convert(mode)


def _img(detail: str | None = None) -> dict:
    return {"type": "image_url", "image_url": {"url": URL, "detail": detail}}


def _text(text: str) -> dict:
    return {"type": "text", "text": text}


def _hf_messages(messages: list[dict], images: list[Image.Image]) -> list[dict]:
    """The same conversation as transformers takes it: images in place of the image parts."""
    todo = iter(images)
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = [{"type": "image", "image": next(todo)} if p["type"] == "image_url"
                       else p for p in content]
        out.append({**m, "content": content})
    return out


def _pixels(inputs) -> np.ndarray:
    return np.stack([np.frombuffer(i.pixels, np.float32).reshape(i.shape) for i in inputs])


CONVERSATION = [
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": [_text("What is in"), _img(), _text("and in"), _img("low")]},
    {"role": "assistant", "content": "Noise."},
    {"role": "user", "content": [_img("high"), _text("  And this one?  ")]},
]


def test_equal_to_transformers_gemma3_processor(setup):
    ctx, hf = setup
    images = [_image(1), _image(2, (300, 20), "RGBA"), _image(1, mode="L")]
    body = ChatCompletionRequest(model="m", messages=CONVERSATION)
    text, ids, inputs = render_chat_images(ctx, body, images)

    want = hf.apply_chat_template(_hf_messages(CONVERSATION, images), chat_template=CHAT_TEMPLATE,
                                  add_generation_prompt=True, tokenize=True, return_dict=True,
                                  return_tensors="np")
    assert ids == want["input_ids"][0].tolist()
    np.testing.assert_array_equal(_pixels(inputs), want["pixel_values"])  # bit for bit
    assert text == hf.apply_chat_template(_hf_messages(CONVERSATION, images),
                                          chat_template=CHAT_TEMPLATE, add_generation_prompt=True,
                                          tokenize=False).replace(BOI, hf.full_image_sequence)

    boi, eoi, image_id = ctx.tokenizer.encode_prompt(BOI + EOI + IMAGE_TOKEN)
    assert [(i.length, i.shape) for i in inputs] == [(16, [3, 64, 64])] * 3
    for i in inputs:  # each span: exactly the image's tokens, between its boundary tokens
        assert set(ids[i.offset:i.offset + i.length]) == {image_id}
        assert (ids[i.offset - 1], ids[i.offset + i.length]) == (boi, eoi)
    assert inputs[0].offset < inputs[1].offset < inputs[2].offset
    assert sum(t == image_id for t in ids) == 48
    assert inputs[0].key != inputs[1].key and inputs[2].key != inputs[0].key  # L != RGB pixels


def test_the_same_image_gives_the_same_key_and_detail_changes_nothing(setup):
    ctx, _ = setup
    messages = [{"role": "user", "content": [_img("low"), _img("high"), _text("Same?")]}]
    body = ChatCompletionRequest(model="m", messages=messages)
    _, _, (a, b) = render_chat_images(ctx, body, [_image(5), _image(5)])
    assert a.key == b.key and a.pixels == b.pixels and len(a.key) == 32


def test_the_next_turn_extends_the_prompt(setup):
    """Turn 2's ids start with turn 1's prompt and answer, the image at the same span with the
    same key: what lets the prefix cache keep the image's KV."""
    ctx, _ = setup
    first = [{"role": "user", "content": [_text("Describe"), _img()]}]
    _, ids1, (image1,) = render_chat_images(
        ctx, ChatCompletionRequest(model="m", messages=first), [_image(7)])
    second = first + [{"role": "assistant", "content": "Static."},
                      {"role": "user", "content": "Sure?"}]
    _, ids2, (image2,) = render_chat_images(
        ctx, ChatCompletionRequest(model="m", messages=second), [_image(7)])
    answer = ctx.tokenizer.encode_prompt("Static.")
    assert ids2[:len(ids1) + len(answer)] == ids1 + answer
    assert (image1.offset, image1.length, image1.key) == (image2.offset, image2.length,
                                                           image2.key)


def test_without_images_it_is_the_text_path(setup):
    ctx, _ = setup
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Hi"}])
    text, ids, inputs = render_chat_images(SimpleNamespace(tokenizer=ctx.tokenizer, images=None),
                                           body, [])
    assert (text, ids, inputs) == (render_messages(ctx, body),
                                   ctx.tokenizer.encode_prompt(render_messages(ctx, body)), [])


@pytest.mark.parametrize("messages, num_images, message", [
    ([{"role": "user", "content": [_text("Look: <start_of_image>"), _img()]}], 1,
     "holds <start_of_image> 2 times for 1 images"),
    ([{"role": "user", "content": [_text("A <image_soft_token> here"), _img()]}], 1,
     "2 runs of image tokens for 1 images"),
    ([{"role": "user", "content": [_img(), _img()]}], 1, "1 images for 2 image parts"),
])
def test_refusals(setup, messages, num_images, message):
    ctx, _ = setup
    body = ChatCompletionRequest(model="m", messages=messages)
    with pytest.raises(ValueError, match=message):
        render_chat_images(ctx, body, [_image(i) for i in range(num_images)])


def test_images_to_a_text_only_model(setup):
    ctx, _ = setup
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": [_img()]}])
    text_only = SimpleNamespace(tokenizer=ctx.tokenizer, images=None)
    with pytest.raises(ValueError, match="takes text only"):
        render_chat_images(text_only, body, [_image(0)])


def test_a_template_error_is_render_messages_error(setup):
    ctx, _ = setup
    messages = [{"role": "user", "content": [_img()]}, {"role": "user", "content": "again"}]
    with pytest.raises(OpenAIError, match="roles must alternate"):
        render_chat_images(ctx, ChatCompletionRequest(model="m", messages=messages), [_image(0)])


def test_the_api_process_modules_load_no_torch():
    code = textwrap.dedent("""
        import sys
        import radixserve.frontend.chat_images, radixserve.multimodal.select
        import radixserve.multimodal.gemma3
        print("torch" in sys.modules)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False"]
