"""Mistral 3 with images end to end (issue 61) on a tiny random checkpoint
(tests/tiny_mistral3_vlm.py: a 3-block Pixtral tower, the 2 x 2 patch merger, a Ministral 3
text model): an image's token rows are broken by [IMG_BREAK] and ended by [IMG_END], the
encoder's rows spliced over the [IMG] tokens only; greedy answers and logprobs equal
transformers' `Mistral3ForConditionalGeneration.generate` (float32) on the same token ids and
pixels, for one picture, another of another shape, both in one prompt; from the folder,
chunked through the rows and their breaks, from the prefix cache, batched, and from the text
GGUF with its mmproj beside it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_mistral3_vlm import make_mistral3_vlm_hf, mistral3_vlm_mmproj_gguf, mistral3_vlm_text_gguf

from radixserve import LLM, SamplingParams
from radixserve.multimodal.prompt import place_images
from radixserve.multimodal.select import image_processor_for

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)
SIZES = {1: (150, 100), 2: (90, 120)}  # (width, height)


def picture(seed: int) -> Image.Image:
    w, h = SIZES[seed]
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), np.uint8))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_mistral3_vlm_hf(tmp_path_factory.mktemp("mistral3vl") / "hf", seed=1)


@pytest.fixture(scope="module")
def reference(folder):
    """{case: (prompt text, [pictures], transformers' greedy tokens, their logprobs)},
    transformers fed our token ids and pixels (tests/multimodal holds our processor to
    transformers'), the pictures padded to one size with their own sizes beside."""
    from transformers import AutoTokenizer, Mistral3ForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = Mistral3ForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32)
    llm_tokenizer = LLM(str(folder), show_progress=False, speculative="off").tokenizer
    processor = image_processor_for(str(folder), None, llm_tokenizer)
    out = {}
    for case, seeds in {"one": (1,), "other": (2,), "both": (1, 2)}.items():
        parts = [{"type": "image"}] * len(seeds) + [{"type": "text", "text": "Describe it."}]
        text = tokenizer.apply_chat_template([{"role": "user", "content": parts}],
                                             add_generation_prompt=True, tokenize=False)
        pictures = [picture(s) for s in seeds]
        _, ids, inputs = place_images(text, pictures, [None] * len(seeds), processor,
                                      llm_tokenizer.encode_prompt)
        height = max(im.shape[1] for im in inputs)
        width = max(im.shape[2] for im in inputs)
        pixels = torch.zeros(len(inputs), 3, height, width)
        for i, im in enumerate(inputs):
            pixels[i, :, :im.shape[1], :im.shape[2]] = torch.from_numpy(
                np.frombuffer(im.pixels, np.float32).copy().reshape(im.shape))
        sizes = torch.tensor([im.shape[1:] for im in inputs])
        with torch.no_grad():
            gen = model.generate(input_ids=torch.tensor([ids]), pixel_values=pixels,
                                 image_sizes=sizes, max_new_tokens=GREEDY.max_tokens,
                                 do_sample=False, output_logits=True,
                                 return_dict_in_generate=True)
        tokens = gen.sequences[0, len(ids):].tolist()
        out[case] = text, pictures, tokens, [torch.log_softmax(s[0].float(), -1)[t].item()
                                             for s, t in zip(gen.logits, tokens)]
        assert all(im.row_breaks and im.length == im.grid[1] * (im.grid[2] + 1)
                   for im in inputs)
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
    for case in ("one", "other", "both"):
        assert same(ask(llm, reference[case])[0], reference[case]), case
    answer, cached = ask(llm, reference["both"])  # again: both pictures from the prefix cache
    assert same(answer, reference["both"]) and cached > 0
    assert llm.engine.images.stats.num_images_encoded == 2
    llm.close()


def test_chunked_and_batched(folder, reference):
    llm = LLM(str(folder), block_size=4, show_progress=False, speculative="off",
              max_num_batched_tokens=7, enable_prefix_caching=False)
    cases = ("one", "other", "both")
    prompts = [{"prompt": reference[c][0], "multi_modal_data": {"image": reference[c][1]}}
               for c in cases] + ["A plain text prompt"]
    for case, out in zip(cases, llm.generate(prompts, GREEDY)):
        sample = out.outputs[0]
        got = sample.token_ids, [e[t].logprob for t, e in zip(sample.token_ids, sample.logprobs)]
        assert same(got, reference[case]), case
    llm.close()


def test_the_gguf_with_its_mmproj(folder, reference, tmp_path):
    text = mistral3_vlm_text_gguf(folder, tmp_path / "mistral3vl-tiny-F32.gguf", "F32")
    mistral3_vlm_mmproj_gguf(folder, tmp_path / "mmproj-mistral3vl-tiny-f32.gguf", "f32")
    llm = LLM(str(text), block_size=4, show_progress=False, speculative="off")
    assert same(ask(llm, reference["both"])[0], reference["both"])
    llm.close()
