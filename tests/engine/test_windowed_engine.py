"""The engine's guarantees on a model with sliding-window layers (a tiny Gemma 3: window 8,
blocks of 4, five sliding layers and a global one; its Q4_K_M GGUF in the default mode, blocks
as stored, one native call per layer): greedy tokens alone = batched = chunked = preempted = from
the prefix cache = through the Python layers, with prompts and outputs well past the window; and
the float model's greedy tokens equal transformers' own greedy generation."""

from __future__ import annotations

import random

import pytest
import torch
from test_llm_embedded import swapped_scheduler, token_ids
from tiny_models import hf_to_gguf, make_hf_model

from radixserve import LLM, SamplingParams
from radixserve.kernels import native

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


def _prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(11)
    return [[rng.randrange(vocab) for _ in range(n)] for n in (5, 30, 13, 9, 22, 17)]


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory):
    return make_hf_model("gemma3", tmp_path_factory.mktemp("gemma3") / "hf", seed=4)


@pytest.fixture(scope="module")
def llm(gemma3_dir, tmp_path_factory):
    path = hf_to_gguf(gemma3_dir, tmp_path_factory.mktemp("gemma3_gguf") / "g.gguf", "Q4_K_M")
    return LLM(str(path), block_size=4, show_progress=False)


@pytest.fixture(scope="module")
def alone(llm):
    return [llm.generate(p, GREEDY)[0].outputs[0].token_ids
            for p in _prompts(llm.engine.vocab_size)]


def test_runs_as_stored(llm):
    from radixserve.layers.block_linear import BlockLinear

    expected = BlockLinear if native.load() is not None else torch.nn.Linear
    assert isinstance(llm.engine.runner.model.layers[0].mlp.gate_up_proj, expected)


@pytest.mark.skipif(native.load() is None, reason="the native layer stack needs the kernels")
def test_native_layer_stack_greedy_equals_the_python_layers(llm, alone):
    """The alone runs above went through one native call per layer; the Python Gemma layers
    give the same greedy tokens, batched."""
    from radixserve.models.native_stack import NativeLayerStack, PythonLayerStack

    model = llm.engine.runner.model
    assert isinstance(model._stack, NativeLayerStack)
    try:
        model._stack = PythonLayerStack(model.layers)
        assert token_ids(llm.generate(_prompts(llm.engine.vocab_size), GREEDY)) == alone
    finally:
        model._stack = None  # rebuilt at the next forward


def test_batch_equals_alone(llm, alone):
    assert token_ids(llm.generate(_prompts(llm.engine.vocab_size), GREEDY)) == alone


def test_chunked_prefill_equals_alone(llm, alone):
    with swapped_scheduler(llm, max_num_batched_tokens=5) as s:
        assert token_ids(llm.generate(_prompts(llm.engine.vocab_size), GREEDY)) == alone
        s.check_integrity()


def test_preempted_equals_alone(llm, alone):
    # 60 pool blocks (6 a page before release: 1 global layer, 5 sliding; ~4 sliding pages
    # held past the window, fed 8 tokens a step) hold one sequence of 50 tokens, not six:
    # some are preempted
    with swapped_scheduler(llm, num_blocks=60, max_num_batched_tokens=8) as s:
        preemptions = []
        original = s._preempt

        def spy(request):
            preemptions.append(request.request_id)
            original(request)

        s._preempt = spy
        assert token_ids(llm.generate(_prompts(llm.engine.vocab_size), GREEDY)) == alone
        assert preemptions, "the small pool should have forced preemption"
        assert s.kv.block_pool.num_free_blocks == 59  # all but the null block


def test_prefix_cache_hit_equals_cold_run(llm):
    prefix = _prompts(llm.engine.vocab_size)[1]  # 30 tokens: many windows long
    prompts = [prefix + p for p in _prompts(llm.engine.vocab_size)]
    with swapped_scheduler(llm):  # NoPrefixCache: a cold reference
        cold = token_ids(llm.generate(prompts, GREEDY))
    first = llm.generate(prompts, GREEDY)
    second = llm.generate(prompts, GREEDY)
    assert token_ids(first) == token_ids(second) == cold
    assert [r.num_cached_tokens for r in second] == [
        (len(r.prompt_token_ids) - 1) // 4 * 4 for r in second]
    llm.engine.scheduler.check_integrity()


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_float_model_greedy_equals_transformers_generate(arch, tmp_path):
    from transformers import AutoModelForCausalLM

    path = make_hf_model(arch, tmp_path / arch, seed=6)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ours = LLM(str(path), block_size=4, show_progress=False)
    prompts = _prompts(ours.engine.vocab_size)[:3]
    got = token_ids(ours.generate(prompts, GREEDY))
    for prompt, tokens in zip(prompts, got):
        with torch.inference_mode():
            out = reference.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False,
                                     min_new_tokens=20)
        assert tokens == out[0, len(prompt):].tolist()
