"""Gemma 3 with images end to end (issue 61) on a tiny random checkpoint
(tests/tiny_gemma3_vlm.py: 6 text layers with a window of 8 tokens, a 16-token image): greedy
answers about an image equal transformers' `Gemma3ForConditionalGeneration.generate` (float32,
its image rows attending to their whole image, its windowed layers too) from the folder and
from the text GGUF with llama.cpp's mmproj beside it; the same answer chunked (an image is
never split across steps) and from the prefix cache, whose hit covers the image; another image
is not taken for it; the encoder runs once per image."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_gemma3_mmproj import gemma3_mmproj_gguf
from tiny_gemma3_vlm import gemma3_vlm_text_gguf, make_gemma3_vlm_hf

from radixserve import LLM, SamplingParams
from radixserve.kernels import native

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)
QUESTION = "Describe the picture."


def picture(seed: int, size=(80, 60)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    if native.load() is None:
        pytest.skip("Gemma 3's image rows need the native attention")
    return make_gemma3_vlm_hf(tmp_path_factory.mktemp("gemma3vlm") / "hf", seed=3)


@pytest.fixture(scope="module")
def reference(folder):
    """(the prompt text with its placeholder, {picture: (transformers' greedy tokens, their
    logprobs)})."""
    from transformers import AutoProcessor, Gemma3ForConditionalGeneration

    processor = AutoProcessor.from_pretrained(str(folder), backend="pil")
    model = Gemma3ForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32)
    messages = [{"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": QUESTION}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    out = {}
    for seed in (1, 2):
        inputs = processor(text=text, images=[picture(seed)], return_tensors="pt")
        with torch.no_grad():
            gen = model.generate(**inputs, max_new_tokens=GREEDY.max_tokens, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True)
        tokens = gen.sequences[0, inputs["input_ids"].shape[1]:].tolist()
        logprobs = [torch.log_softmax(step[0].float(), -1)[t].item()
                    for step, t in zip(gen.logits, tokens)]
        out[seed] = tokens, logprobs
    return text, out


def ask(llm: LLM, text: str, seed: int):
    """(greedy tokens, their logprobs), the prompt tokens found cached."""
    out = llm.generate({"prompt": text, "multi_modal_data": {"image": picture(seed)}},
                       GREEDY)[0]
    llm.engine.scheduler.kv.check_integrity()
    sample = out.outputs[0]
    logprobs = [entry[t].logprob for t, entry in zip(sample.token_ids, sample.logprobs)]
    return (sample.token_ids, logprobs), out.num_cached_tokens


def same(got, want, atol=5e-3) -> bool:
    return got[0] == want[0] and np.allclose(got[1], want[1], atol=atol)


def test_the_folder_answers_as_transformers_and_reuses_the_image(folder, reference):
    text, want = reference
    llm = LLM(str(folder), block_size=4, show_progress=False, speculative="off")
    stats = llm.engine.images.stats
    answer, cached = ask(llm, text, 1)
    assert same(answer, want[1]) and cached == 0
    answer, cached = ask(llm, text, 1)  # again: the image's KV from the prefix cache
    assert same(answer, want[1])
    image_end = text.index("<start_of_image>")  # (characters: only that it is cached past it)
    assert cached >= 16 and image_end > 0
    assert same(ask(llm, text, 2)[0], want[2])  # another picture: not taken for the first
    assert stats.num_images_encoded == 2 and stats.num_image_rows == 32
    llm.close()


def test_chunked_prefill_keeps_each_image_whole(folder, reference):
    """A budget of 20 tokens a step: a chunk would end inside the image; it stops before it
    and the next one takes the image whole (its rows attend both ways)."""
    text, want = reference
    llm = LLM(str(folder), block_size=4, show_progress=False, speculative="off",
              max_num_batched_tokens=20, enable_prefix_caching=False)
    assert same(ask(llm, text, 2)[0], want[2])
    llm.close()


@pytest.mark.parametrize("budget", [2048, 20])
def test_the_torch_attention_sees_whole_images_too(folder, reference, monkeypatch, budget):
    """The torch backend (heads over 256 dims, no native kernels) takes the image rows'
    limits too: whole prompts, and chunks (the image's rows from the pool's context)."""
    import radixserve.runner.model_runner as model_runner

    monkeypatch.setattr(model_runner, "resolve_attn_backend", lambda *a, **k: "torch")
    text, want = reference
    llm = LLM(str(folder), block_size=4, show_progress=False, speculative="off",
              max_num_batched_tokens=budget, enable_prefix_caching=budget == 2048,
              kv_cache_dtype="float32")
    assert llm.engine.runner.backend_name == "torch"
    assert same(ask(llm, text, 1)[0], want[1]) and same(ask(llm, text, 2)[0], want[2])
    llm.close()


def test_the_gguf_with_its_mmproj_answers_as_transformers(folder, reference, tmp_path):
    text, want = reference
    model = gemma3_vlm_text_gguf(folder, tmp_path / "gemma3-tiny-F32.gguf", "F32")
    gemma3_mmproj_gguf(folder, tmp_path / "mmproj-gemma3-tiny-f32.gguf", "f32")
    llm = LLM(str(model), block_size=4, show_progress=False, speculative="off")  # found
    assert same(ask(llm, text, 1)[0], want[1])
    llm.close()


def test_batched_equals_alone(folder, reference, tmp_path):
    """Two pictures and a text prompt in one batch (the Q8_0 file, as stored: native linears
    whose rows do not depend on the batch) answer exactly as each alone."""
    text, _ = reference
    model = gemma3_vlm_text_gguf(folder, tmp_path / "gemma3-tiny-Q8_0.gguf", "Q8_0")
    gemma3_mmproj_gguf(folder, tmp_path / "mmproj-gemma3-tiny-f16.gguf", "f16")
    llm = LLM(str(model), block_size=4, show_progress=False, speculative="off",
              enable_prefix_caching=False)
    prompts = [{"prompt": text, "multi_modal_data": {"image": picture(seed)}} for seed in (1, 2)]
    prompts.append({"prompt": "<start_of_turn>user\\nHello there<end_of_turn>\\n"})
    alone = [llm.generate(p, GREEDY)[0].outputs[0] for p in prompts]
    together = [out.outputs[0] for out in llm.generate(prompts, GREEDY)]
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    assert alone[0].logprobs != alone[1].logprobs  # each picture is its own
    llm.close()


def test_preempted_equals_alone(folder, reference, tmp_path):
    """Both requests preempted mid-answer (recomputed from their prompts, the images spliced
    again from the encoder's cache) answer exactly as each alone."""
    text, _ = reference
    model = gemma3_vlm_text_gguf(folder, tmp_path / "gemma3-tiny-Q8_0.gguf", "Q8_0")
    gemma3_mmproj_gguf(folder, tmp_path / "mmproj-gemma3-tiny-f16.gguf", "f16")
    llm = LLM(str(model), block_size=4, show_progress=False, speculative="off",
              enable_prefix_caching=False)
    prompts = [{"prompt": text, "multi_modal_data": {"image": picture(seed)}} for seed in (1, 2)]
    alone = [llm.generate(p, GREEDY)[0].outputs[0] for p in prompts]
    step, steps = llm.engine.step, []

    def preempting():
        steps.append(None)
        if len(steps) == 4:  # both are decoding
            assert len(llm.engine.scheduler.preempt_running()) == 2
        return step()

    llm.engine.step = preempting
    together = [out.outputs[0] for out in llm.generate(prompts, GREEDY)]
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    assert llm.engine.images.stats.num_encoder_hits == 4  # before and after: never re-encoded
    llm.close()


def test_a_tower_this_engine_cannot_run_leaves_the_text_serving(folder, tmp_path, caplog):
    """Images with tensor parallel are not supported yet: the folder's own tower is then left
    out with a WARNING (the text serves, images are refused); an mmproj asked for with
    --mmproj stops the start."""
    from dataclasses import replace
    from types import SimpleNamespace

    from radixserve.core.images import NO_IMAGES
    from radixserve.engine.vision_setup import attach_image_encoder

    llm = LLM(str(folder), block_size=4, show_progress=False, speculative="off")
    model = llm.engine.runner.model
    runner = SimpleNamespace(device=torch.device("cpu"), images=NO_IMAGES)
    config = replace(llm.config, mmproj=None,
                     parallel=replace(llm.config.parallel, tensor_parallel_size=2))
    with caplog.at_level("WARNING", logger="radixserve.engine.vision_setup"):
        assert attach_image_encoder(config, str(folder), model, runner, torch.float32) is config
    assert runner.images is NO_IMAGES and "images are off" in caplog.text
    assert "tensor-parallel" in caplog.text
    mmproj = gemma3_mmproj_gguf(folder, tmp_path / "mmproj-f32.gguf", "f32")
    with pytest.raises(ValueError, match="tensor-parallel"):
        attach_image_encoder(replace(config, mmproj=str(mmproj)), str(folder), model, runner,
                             torch.float32)
    llm.close()
