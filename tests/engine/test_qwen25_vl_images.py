"""Qwen2.5-VL with images end to end (issue 61) on a tiny random checkpoint
(tests/tiny_qwen25_vl.py: a ViT with window attention, a 2-layer Qwen2 with mRoPE sections
[2, 3, 3]): an image's rows sit on their token grid (mRoPE), the text after it shifted back;
greedy answers and logprobs equal transformers' `Qwen2_5_VLForConditionalGeneration.generate`
(float32) on the same token ids and patches, from the folder and from the text GGUF with its
mmproj beside it, chunked through the middle of an image, from the prefix cache, with two
pictures in one prompt, and batched beside other requests."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_qwen25_vl import make_qwen25_vl_hf, qwen25_vl_mmproj_gguf, qwen25_vl_text_gguf

from radixserve import LLM, SamplingParams
from radixserve.multimodal.prompt import place_images
from radixserve.multimodal.select import image_processor_for

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)
SIZES = {1: (150, 100), 2: (90, 120)}  # two pictures of other grids


def picture(seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    w, h = SIZES[seed]
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def chat(num_images: int) -> list[dict]:
    parts = [{"type": "image"}] * num_images + [{"type": "text", "text": "Describe it."}]
    return [{"role": "user", "content": parts}]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_qwen25_vl_hf(tmp_path_factory.mktemp("qwen25vl") / "hf", seed=1)


@pytest.fixture(scope="module")
def reference(folder):
    """{case: (prompt text, [pictures], transformers' greedy tokens, their logprobs)} for
    one picture (seed 1, seed 2) and both in one prompt, transformers fed our token ids and
    patches (tests/multimodal holds our processor to transformers')."""
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32)
    llm_tokenizer = LLM(str(folder), show_progress=False, speculative="off").tokenizer
    processor = image_processor_for(str(folder), None, llm_tokenizer)
    out = {}
    for case, seeds in {"one": (1,), "other": (2,), "both": (1, 2)}.items():
        text = tokenizer.apply_chat_template(chat(len(seeds)), add_generation_prompt=True,
                                             tokenize=False)
        pictures = [picture(s) for s in seeds]
        _, ids, inputs = place_images(text, pictures, [None] * len(seeds), processor,
                                      llm_tokenizer.encode_prompt)
        patches = torch.cat([torch.from_numpy(np.frombuffer(im.pixels, np.float32).copy().reshape(
            -1, im.shape[-1])) for im in inputs])
        ids_t = torch.tensor([ids])
        with torch.no_grad():
            gen = model.generate(
                input_ids=ids_t, pixel_values=patches,
                image_grid_thw=torch.tensor([im.shape[:3] for im in inputs]),
                mm_token_type_ids=(ids_t == processor.image_token_id).int(),
                attention_mask=torch.ones_like(ids_t), max_new_tokens=GREEDY.max_tokens,
                do_sample=False, output_logits=True, return_dict_in_generate=True)
        tokens = gen.sequences[0, len(ids):].tolist()
        out[case] = text, pictures, tokens, [torch.log_softmax(s[0].float(), -1)[t].item()
                                             for s, t in zip(gen.logits, tokens)]
        assert all(im.grid[1] * im.grid[2] == im.length for im in inputs)
    assert out["one"][2] != out["other"][2]  # the answers follow the picture
    return out


def ask(llm: LLM, case) -> tuple:
    text, pictures = case[:2]
    out = llm.generate({"prompt": text, "multi_modal_data": {"image": pictures}}, GREEDY)[0]
    llm.engine.scheduler.kv.check_integrity()
    sample = out.outputs[0]
    logprobs = [entry[t].logprob for t, entry in zip(sample.token_ids, sample.logprobs)]
    return (sample.token_ids, logprobs), out.num_cached_tokens


def same(got, case, atol=2e-3) -> bool:
    return got[0] == case[2] and np.allclose(got[1], case[3], atol=atol)


def test_the_folder_answers_as_transformers(folder, reference):
    llm = LLM(str(folder), block_size=4, show_progress=False, speculative="off")
    answer, cached = ask(llm, reference["one"])
    assert same(answer, reference["one"]) and cached == 0
    answer, cached = ask(llm, reference["one"])  # the image's KV from the prefix cache
    assert same(answer, reference["one"]) and cached > 20
    assert same(ask(llm, reference["other"])[0], reference["other"])
    assert same(ask(llm, reference["both"])[0], reference["both"])
    assert llm.engine.images.stats.num_images_encoded == 2  # each picture encoded once
    llm.close()


def test_chunks_through_an_image(folder, reference):
    llm = LLM(str(folder), block_size=4, show_progress=False, speculative="off",
              max_num_batched_tokens=16, enable_prefix_caching=False)
    assert not llm.engine.scheduler.config.whole_images  # causal: images may be split
    assert same(ask(llm, reference["both"])[0], reference["both"])
    llm.close()


def test_batched_beside_text_and_another_picture(folder, reference):
    llm = LLM(str(folder), block_size=4, show_progress=False, speculative="off")
    prompts = [{"prompt": reference[c][0], "multi_modal_data": {"image": reference[c][1]}}
               for c in ("one", "other", "both")] + ["A plain text prompt"]
    outs = llm.generate(prompts, GREEDY)
    for case, out in zip(("one", "other", "both"), outs):
        sample = out.outputs[0]
        got = sample.token_ids, [e[t].logprob for t, e in zip(sample.token_ids, sample.logprobs)]
        assert same(got, reference[case]), case
    llm.close()


def test_the_gguf_with_its_mmproj(folder, reference, tmp_path):
    model = qwen25_vl_text_gguf(folder, tmp_path / "qwen25vl-tiny-F32.gguf", "F32")
    qwen25_vl_mmproj_gguf(folder, tmp_path / "mmproj-qwen25vl-tiny-f32.gguf", "f32")
    llm = LLM(str(model), block_size=4, show_progress=False, speculative="off")
    assert same(ask(llm, reference["both"])[0], reference["both"])
    llm.close()


def test_image_max_tokens_downscales_larger_pictures(folder, reference):
    llm = LLM(str(folder), block_size=4, show_progress=False, speculative="off",
              image_max_tokens=8)
    text, pictures = reference["one"][:2]
    out = llm.generate({"prompt": text, "multi_modal_data": {"image": pictures}}, GREEDY)[0]
    image_id = llm.image_processor.image_token_id
    assert 0 < out.prompt_token_ids.count(image_id) <= 8 < 20  # 20 at the model's own limits
    llm.close()
