"""Gemma 4 with images end to end (issue 61) on a tiny random checkpoint
(tests/tiny_gemma4_vlm.py: the E2B layout's text model, with per-layer inputs and shared KV, and
a 2-layer vision tower pooling 3 x 3 patches): greedy answers and logprobs equal transformers'
`Gemma4ForConditionalGeneration.generate` (float32) on the same token ids and patches, for one
picture, another of another shape, both in one prompt; from the folder (E2B's causal image rows,
and the larger releases' sliding layers that see a whole image), chunked, from the prefix cache,
batched, and from the text GGUF with its mmproj beside it. (The KV pool is float32 here: the
tiny model's large logits move by up to ~4e-3 with the default float16 pool.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_gemma4_vlm import gemma4_vlm_mmproj_gguf, gemma4_vlm_text_gguf, make_gemma4_vlm_hf

from radixserve import LLM, SamplingParams
from radixserve.multimodal.prompt import place_images
from radixserve.multimodal.select import image_processor_for

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)
SIZES = {1: (36, 24), 2: (24, 48)}  # (width, height)


def picture(seed: int) -> Image.Image:
    w, h = SIZES[seed]
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), np.uint8))


def transformers_inputs(inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Our images' patches as transformers takes them: [images, most patches, D], padded with
    zeros at positions (-1, -1), and each patch's (x, y)."""
    most = max(im.shape[0] * im.shape[1] for im in inputs)
    pixels = torch.zeros(len(inputs), most, inputs[0].shape[2])
    where = torch.full((len(inputs), most, 2), -1, dtype=torch.long)
    for i, im in enumerate(inputs):
        ph, pw, d = im.shape
        pixels[i, :ph * pw] = torch.from_numpy(
            np.frombuffer(im.pixels, np.float32).copy().reshape(ph * pw, d))
        ys, xs = np.meshgrid(np.arange(ph), np.arange(pw), indexing="ij")
        where[i, :ph * pw] = torch.from_numpy(np.stack([xs.ravel(), ys.ravel()], -1))
    return pixels, where


def references(folder) -> dict:
    """{case: (prompt text, [pictures], transformers' greedy tokens, their logprobs)}."""
    from transformers import AutoTokenizer, Gemma4ForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = Gemma4ForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32)
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
        pixels, where = transformers_inputs(inputs)
        ids_t = torch.tensor([ids])
        with torch.no_grad():
            gen = model.generate(
                input_ids=ids_t, pixel_values=pixels, image_position_ids=where,
                mm_token_type_ids=(ids_t == processor.image_token_id).long(),
                attention_mask=torch.ones_like(ids_t), max_new_tokens=GREEDY.max_tokens,
                do_sample=False, output_logits=True, return_dict_in_generate=True)
        tokens = gen.sequences[0, len(ids):].tolist()
        out[case] = text, pictures, tokens, [torch.log_softmax(s[0].float(), -1)[t].item()
                                             for s, t in zip(gen.logits, tokens)]
    assert out["one"][2] != out["other"][2]  # the answers follow the picture
    return out


@pytest.fixture(scope="module", params=[False, True], ids=["causal", "sliding-both-ways"])
def model(request, tmp_path_factory):
    folder = make_gemma4_vlm_hf(tmp_path_factory.mktemp("gemma4vl") / "hf", seed=1,
                                bidirectional=request.param)
    return folder, request.param, references(folder)


def ask(llm: LLM, case) -> tuple:
    text, pictures = case[:2]
    out = llm.generate({"prompt": text, "multi_modal_data": {"image": pictures}}, GREEDY)[0]
    llm.engine.scheduler.kv.check_integrity()
    sample = out.outputs[0]
    logprobs = [entry[t].logprob for t, entry in zip(sample.token_ids, sample.logprobs)]
    return (sample.token_ids, logprobs), out.num_cached_tokens


def same(got, case, atol=2e-3) -> bool:
    return got[0] == case[2] and np.allclose(got[1], case[3], atol=atol)


def test_the_folder_answers_as_transformers(model):
    folder, both_ways, want = model
    llm = LLM(str(folder), block_size=4, show_progress=False, speculative="off",
              kv_cache_dtype="float32")
    assert llm.engine.scheduler.config.whole_images == both_ways
    for case in ("one", "other", "both"):
        assert same(ask(llm, want[case])[0], want[case]), case
    answer, cached = ask(llm, want["both"])  # again: both pictures from the prefix cache
    assert same(answer, want["both"]) and cached > 0
    assert llm.engine.images.stats.num_images_encoded == 2
    llm.close()


def test_chunked_and_batched(model):
    folder, _, want = model
    llm = LLM(str(folder), block_size=4, show_progress=False, speculative="off",
              max_num_batched_tokens=64, enable_prefix_caching=False, kv_cache_dtype="float32")
    cases = ("one", "other", "both")
    prompts = [{"prompt": want[c][0], "multi_modal_data": {"image": want[c][1]}}
               for c in cases] + ["A plain text prompt"]
    for case, out in zip(cases, llm.generate(prompts, GREEDY)):
        sample = out.outputs[0]
        got = sample.token_ids, [e[t].logprob for t, e in zip(sample.token_ids, sample.logprobs)]
        assert same(got, want[case]), case
    llm.close()


def test_the_gguf_with_its_mmproj(model, tmp_path):
    folder, both_ways, want = model
    if both_ways:
        pytest.skip("a GGUF with per-layer inputs is E2B / E4B: causal image rows")
    text = gemma4_vlm_text_gguf(folder, tmp_path / "gemma4vl-tiny-F32.gguf", "F32")
    gemma4_vlm_mmproj_gguf(folder, tmp_path / "mmproj-gemma4vl-tiny-f32.gguf", "f32")
    # an mmproj carries no token budget (the releases' 280 then): capped at the folder's 70
    llm = LLM(str(text), block_size=4, show_progress=False, speculative="off",
              kv_cache_dtype="float32", image_max_tokens=70)
    assert same(ask(llm, want["both"])[0], want["both"])
    llm.close()
