"""Embedding requests through the engine core: pooled final-norm hidden states of a tiny
random Qwen3 model equal transformers' (last and mean pooling, L2-normalised), batched =
alone, chunked = whole, prefix-cache hits and preemption handled."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixserve import LLM
from radixserve.messages import EngineCoreRequest
from radixserve.frontend.pooling import finish_vector
from radixserve.pooling_params import PoolingParams
from radixserve.sampling_params import SamplingParams

PROMPTS = [[5, 17, 99, 3, 250, 8, 41, 77, 12, 300, 7, 9, 64, 128, 200, 31, 2, 60],
           [11, 42, 7], [5, 17, 99, 3, 250, 8, 41, 77, 12, 300, 7, 9, 64, 128, 200, 31, 2, 61],
           list(range(20, 60))]


@pytest.fixture(scope="module")
def reference(tiny_hf_dirs):
    """transformers' final-norm hidden states of each prompt, pooled both ways."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_hf_dirs["qwen3"], dtype=torch.float32)
    out = {}
    with torch.no_grad():
        for i, ids in enumerate(PROMPTS):
            h = model.model(torch.tensor([ids])).last_hidden_state[0]
            out["last", i] = finish_vector(h[-1].tolist())
            out["mean", i] = finish_vector(h.mean(0).tolist())
    return out


def _make_llm(path, **kw):
    return LLM(str(path), show_progress=False, num_kv_blocks=64, **kw)


@pytest.fixture(scope="module")
def llm(tiny_hf_dirs):
    return _make_llm(tiny_hf_dirs["qwen3"])


def _embed(llm, prompts, pooling, gen_too=False):
    """Add every prompt at once (one batch), step to the end; {index: normalised vector}."""
    core = llm.engine
    base = next(llm._ids)
    for i, ids in enumerate(prompts):
        core.add_request(EngineCoreRequest(
            request_id=f"e{base}-{i}", prompt_token_ids=ids, sampling_params=SamplingParams(),
            pooling_params=PoolingParams(pooling=pooling)))
    if gen_too:  # a generating request in the same steps
        core.add_request(EngineCoreRequest(
            request_id=f"g{base}", prompt_token_ids=prompts[0],
            sampling_params=SamplingParams(temperature=0, max_tokens=4)))
    got = {}
    while core.has_unfinished_requests():
        for out in core.step().outputs:
            assert out.error is None, out.error
            if out.request_id.startswith("e"):
                assert out.finish_reason == "stop" and out.new_token_ids == []
                got[int(out.request_id.rsplit("-", 1)[1])] = finish_vector(out.pooled)
        core.scheduler.check_integrity()
    assert core.scheduler.kv.usage == 0.0  # nothing held beyond the prefix cache
    return got


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_pooled_vectors_match_transformers_batched_and_alone(llm, reference, pooling):
    batched = _embed(llm, PROMPTS, pooling, gen_too=True)
    for i in range(len(PROMPTS)):
        alone = _embed(llm, [PROMPTS[i]], pooling)[0]
        np.testing.assert_allclose(batched[i], reference[pooling, i], atol=3e-4)
        np.testing.assert_allclose(alone, batched[i], atol=1e-6)
        assert abs(np.linalg.norm(alone) - 1) < 1e-5


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_chunked_prefill_and_prefix_hits(tiny_hf_dirs, reference, pooling):
    """A 4-token budget chunks every prompt; PROMPTS[2] shares 16 tokens (a cached block)
    with PROMPTS[0]: last pooling reuses them, mean pooling recomputes them."""
    llm = _make_llm(tiny_hf_dirs["qwen3"], max_num_batched_tokens=4)
    first = _embed(llm, [PROMPTS[0]], pooling)[0]
    hits_before = llm.engine.scheduler.kv.num_hit_tokens
    second = _embed(llm, [PROMPTS[2]], pooling)[0]
    hit = llm.engine.scheduler.kv.num_hit_tokens - hits_before
    assert hit == (16 if pooling == "last" else 0)
    np.testing.assert_allclose(first, reference[pooling, 0], atol=3e-4)
    np.testing.assert_allclose(second, reference[pooling, 2], atol=3e-4)


def test_preempted_mean_request_restarts_its_sum(tiny_hf_dirs, reference):
    """Too few KV blocks for all at once: requests are preempted and recomputed; the mean
    still counts every token once."""
    llm = LLM(str(tiny_hf_dirs["qwen3"]), show_progress=False, num_kv_blocks=4,
              max_num_batched_tokens=8, block_size=16)
    got = _embed(llm, [PROMPTS[3], PROMPTS[0], PROMPTS[1]], "mean")
    for slot, i in enumerate([3, 0, 1]):
        np.testing.assert_allclose(got[slot], reference["mean", i], atol=3e-4)


def test_embedding_prompt_may_fill_the_context(tiny_hf_dirs):
    llm = _make_llm(tiny_hf_dirs["qwen3"], max_model_len=40)
    assert _embed(llm, [PROMPTS[3]], "last")[0].shape == (64,)
    with pytest.raises(ValueError, match="context window is 40"):
        llm.engine.add_request(EngineCoreRequest(
            request_id="long", prompt_token_ids=PROMPTS[3] + [1],
            sampling_params=SamplingParams(), pooling_params=PoolingParams()))
