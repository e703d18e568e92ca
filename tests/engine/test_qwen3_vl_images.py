"""Qwen3-VL with images end to end on a tiny random checkpoint (tests/tiny_qwen3_vl.py: Qwen3
text with interleaved mRoPE sections [2, 3, 3], a 3-block ViT whose deepstack mergers after
blocks 0 and 1 add rows to the text model's hidden states after its layers 0 and 1): greedy
answers and logprobs equal transformers' `Qwen3VLForConditionalGeneration.generate` (float32)
on the same token ids and patches, for one picture, another, both in one prompt; from the
folder, chunked through the images, batched, and from the text GGUF with its mmproj beside
it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_qwen3_vl import make_qwen3_vl_hf, qwen3_vl_mmproj_gguf, qwen3_vl_text_gguf

from radixserve import LLM, SamplingParams
from radixserve.multimodal.prompt import place_images
from radixserve.multimodal.select import image_processor_for

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)
SIZES = {1: (128, 96), 2: (64, 160)}  # (width, height): 4 x 3 and 2 x 5 tokens


def picture(seed: int) -> Image.Image:
    w, h = SIZES[seed]
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), np.uint8))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_qwen3_vl_hf(tmp_path_factory.mktemp("qwen3vl") / "hf", seed=1)


@pytest.fixture(scope="module")
def transformers_model(folder):
    from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

    model = Qwen3VLForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32)
    return AutoTokenizer.from_pretrained(str(folder)), model.eval()


def expected(transformers_model, processor, llm_tokenizer, seeds) -> tuple:
    """(prompt text, [pictures], transformers' greedy tokens, their logprobs) of a chat with
    the pictures ``seeds``, transformers fed our token ids and patches (tests/multimodal holds
    our processor to transformers')."""
    tokenizer, model = transformers_model
    parts = [{"type": "image"}] * len(seeds) + [{"type": "text", "text": "Describe it."}]
    text = tokenizer.apply_chat_template([{"role": "user", "content": parts}],
                                         add_generation_prompt=True, tokenize=False)
    pictures = [picture(s) for s in seeds]
    _, ids, inputs = place_images(text, pictures, [None] * len(seeds), processor,
                                  llm_tokenizer.encode_prompt)
    patches = torch.cat([torch.tensor(np.frombuffer(im.pixels, np.float32)).reshape(
        -1, im.shape[-1]) for im in inputs])
    ids_t = torch.tensor([ids])
    with torch.no_grad():
        gen = model.generate(
            input_ids=ids_t, pixel_values=patches,
            image_grid_thw=torch.tensor([im.shape[:3] for im in inputs]),
            mm_token_type_ids=(ids_t == processor.image_token_id).int(),
            attention_mask=torch.ones_like(ids_t), max_new_tokens=GREEDY.max_tokens,
            do_sample=False, output_logits=True, return_dict_in_generate=True)
    tokens = gen.sequences[0, len(ids):].tolist()
    return text, pictures, tokens, [torch.log_softmax(s[0].float(), -1)[t].item()
                                    for s, t in zip(gen.logits, tokens)]


@pytest.fixture(scope="module")
def reference(folder, transformers_model):
    """{case: `expected`} for one picture (seed 1, seed 2) and both in one prompt."""
    llm_tokenizer = LLM(str(folder), show_progress=False, speculative="off").tokenizer
    processor = image_processor_for(str(folder), None, llm_tokenizer)
    out = {case: expected(transformers_model, processor, llm_tokenizer, seeds)
           for case, seeds in {"one": (1,), "other": (2,), "both": (1, 2)}.items()}
    assert out["one"][2] != out["other"][2]  # the answers follow the picture
    return out


def ask(llm: LLM, case) -> tuple[list[int], list[float]]:
    text, pictures = case[:2]
    sample = llm.generate({"prompt": text, "multi_modal_data": {"image": pictures}},
                          GREEDY)[0].outputs[0]
    llm.engine.scheduler.kv.check_integrity()
    return sample.token_ids, [e[t].logprob for t, e in zip(sample.token_ids, sample.logprobs)]


def same(got, case, atol=2e-3) -> bool:
    return got[0] == case[2] and np.allclose(got[1], case[3], atol=atol)


def test_the_folder_answers_as_transformers(folder, reference):
    llm = LLM(str(folder), block_size=4, show_progress=False, speculative="off")
    for case in ("one", "other", "both"):
        assert same(ask(llm, reference[case]), reference[case]), case
    # again: both pictures' KV (deepstack rows included) from the prefix cache
    text, pictures = reference["both"][:2]
    out = llm.generate({"prompt": text, "multi_modal_data": {"image": pictures}}, GREEDY)[0]
    sample = out.outputs[0]
    got = sample.token_ids, [e[t].logprob for t, e in zip(sample.token_ids, sample.logprobs)]
    assert same(got, reference["both"]) and out.num_cached_tokens > 0
    assert llm.engine.images.stats.num_images_encoded == 2
    llm.close()


def test_chunks_through_the_images(folder, reference):
    llm = LLM(str(folder), block_size=4, show_progress=False, speculative="off",
              max_num_batched_tokens=8, enable_prefix_caching=False)
    assert same(ask(llm, reference["both"]), reference["both"])
    llm.close()


def test_batched_beside_text_and_another_picture(folder, reference):
    llm = LLM(str(folder), block_size=4, show_progress=False, speculative="off")
    cases = ("one", "other", "both")
    prompts = [{"prompt": reference[c][0], "multi_modal_data": {"image": reference[c][1]}}
               for c in cases] + ["A plain text prompt"]
    for case, out in zip(cases, llm.generate(prompts, GREEDY)):
        sample = out.outputs[0]
        got = sample.token_ids, [e[t].logprob for t, e in zip(sample.token_ids, sample.logprobs)]
        assert same(got, reference[case]), case
    llm.close()


def test_the_gguf_with_its_mmproj(folder, transformers_model, tmp_path):
    """The mmproj beside the text GGUF (found by name); its processor takes the release's
    pixel limits (multimodal/qwen_vl_settings.py: 64 tokens at least at patch 16), so
    transformers is fed what it makes."""
    model = qwen3_vl_text_gguf(folder, tmp_path / "qwen3vl-tiny-F32.gguf", "F32")
    mmproj = qwen3_vl_mmproj_gguf(folder, tmp_path / "mmproj-qwen3vl-tiny-f32.gguf", "f32")
    llm = LLM(str(model), block_size=4, show_progress=False, speculative="off")
    processor = image_processor_for(str(model), str(mmproj), llm.tokenizer)
    case = expected(transformers_model, processor, llm.tokenizer, (2,))
    assert same(ask(llm, case), case)
    llm.close()
