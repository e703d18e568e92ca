"""SmolVLM with images end to end (issue 61) on a tiny random checkpoint (tests/tiny_smolvlm.py:
64 px tiles of 16 tokens, a 2-layer Llama): a picture is cut into a grid of tiles plus a global
one, each its own span; greedy answers equal transformers' `SmolVLMForConditionalGeneration.
generate` (float32) on the same token ids and tiles, from the folder and from the text GGUF with
its mmproj beside it, chunked through the middle of a tile, and from the prefix cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_smolvlm import make_smolvlm_hf, smolvlm_mmproj_gguf, smolvlm_text_gguf

from radixserve import LLM, SamplingParams
from radixserve.multimodal.prompt import place_images
from radixserve.multimodal.select import image_processor_for

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)


def picture(seed: int, size=(150, 100)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_smolvlm_hf(tmp_path_factory.mktemp("smolvlm") / "hf", seed=1)


@pytest.fixture(scope="module")
def reference(folder):
    """(the prompt text with its placeholder, {picture: (transformers' greedy tokens, their
    logprobs)}), transformers fed our token ids and tiles (its processor needs torchvision;
    tests/multimodal/test_smolvlm_processor.py holds ours to its image processor)."""
    from transformers import AutoTokenizer, SmolVLMForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    messages = [{"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": "Describe it."}]}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    model = SmolVLMForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32)
    llm_tokenizer = LLM(str(folder), show_progress=False, speculative="off").tokenizer
    processor = image_processor_for(str(folder), None, llm_tokenizer)
    out = {}
    for seed in (1, 2):
        _, ids, inputs = place_images(text, [picture(seed)], [None], processor,
                                      llm_tokenizer.encode_prompt)
        tiles = np.stack([np.frombuffer(im.pixels, np.float32).reshape(im.shape)
                          for im in inputs])
        with torch.no_grad():
            gen = model.generate(input_ids=torch.tensor([ids]),
                                 pixel_values=torch.from_numpy(tiles)[None],
                                 max_new_tokens=GREEDY.max_tokens, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True)
        tokens = gen.sequences[0, len(ids):].tolist()
        out[seed] = tokens, [torch.log_softmax(s[0].float(), -1)[t].item()
                             for s, t in zip(gen.logits, tokens)]
        assert len(inputs) == 7  # 2 x 3 tiles and the global one
    return text, out


def ask(llm: LLM, text: str, seed: int):
    out = llm.generate({"prompt": text, "multi_modal_data": {"image": picture(seed)}},
                       GREEDY)[0]
    llm.engine.scheduler.kv.check_integrity()
    sample = out.outputs[0]
    logprobs = [entry[t].logprob for t, entry in zip(sample.token_ids, sample.logprobs)]
    return (sample.token_ids, logprobs), out.num_cached_tokens


def same(got, want, atol=2e-3) -> bool:
    return got[0] == want[0] and np.allclose(got[1], want[1], atol=atol)


def test_the_folder_answers_as_transformers(folder, reference):
    text, want = reference
    llm = LLM(str(folder), block_size=4, show_progress=False, speculative="off")
    answer, cached = ask(llm, text, 1)
    assert same(answer, want[1]) and cached == 0
    answer, cached = ask(llm, text, 1)
    assert same(answer, want[1]) and cached > 7 * 16  # every tile from the prefix cache
    assert same(ask(llm, text, 2)[0], want[2])
    assert llm.engine.images.stats.num_images_encoded == 14  # 7 tiles a picture
    llm.close()


def test_chunks_through_a_tile(folder, reference):
    text, want = reference
    llm = LLM(str(folder), block_size=4, show_progress=False, speculative="off",
              max_num_batched_tokens=24, enable_prefix_caching=False)
    assert not llm.engine.scheduler.config.whole_images  # causal: tiles may be split
    assert same(ask(llm, text, 2)[0], want[2])
    llm.close()


def test_the_gguf_with_its_mmproj(folder, reference, tmp_path):
    text, want = reference
    model = smolvlm_text_gguf(folder, tmp_path / "smolvlm-tiny-F32.gguf", "F32")
    smolvlm_mmproj_gguf(folder, tmp_path / "mmproj-smolvlm-tiny-f32.gguf", "f32")
    llm = LLM(str(model), block_size=4, show_progress=False, speculative="off")
    assert same(ask(llm, text, 1)[0], want[1])
    llm.close()
