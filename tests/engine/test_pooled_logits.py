"""``PoolingParams.logit_token_ids`` through the engine core (a reranker's "yes"/"no" logits):
the raw last-position logits of the named tokens equal transformers', batched = alone, a
cached prefix reused; bad parameters refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixserve import LLM
from radixserve.messages import EngineCoreRequest
from radixserve.pooling_params import PoolingParams
from radixserve.sampling_params import SamplingParams

PROMPTS = [[5, 17, 99, 3, 250, 8, 41, 77, 12, 300, 7, 9, 64, 128, 200, 31, 2, 60],
           [11, 42, 7],
           [5, 17, 99, 3, 250, 8, 41, 77, 12, 300, 7, 9, 64, 128, 200, 31, 2, 61]]
TOKENS = [[9, 380], [380, 9, 3]]


@pytest.fixture(scope="module")
def reference(tiny_hf_dirs):
    """transformers' last-position logits of each prompt."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_hf_dirs["qwen3"], dtype=torch.float32)
    with torch.no_grad():
        return [model(torch.tensor([ids])).logits[0, -1].numpy() for ids in PROMPTS]


@pytest.fixture(scope="module")
def llm(tiny_hf_dirs):
    return LLM(str(tiny_hf_dirs["qwen3"]), show_progress=False, num_kv_blocks=64)


def _logits(llm, prompts, tokens) -> dict[int, list[float]]:
    """Add every prompt at once (prompt i asks for tokens[i % len(tokens)]), step to the end."""
    core = llm.engine
    base = next(llm._ids)
    for i, ids in enumerate(prompts):
        core.add_request(EngineCoreRequest(
            request_id=f"l{base}-{i}", prompt_token_ids=ids, sampling_params=SamplingParams(),
            pooling_params=PoolingParams(logit_token_ids=tokens[i % len(tokens)])))
    got = {}
    while core.has_unfinished_requests():
        for out in core.step().outputs:
            assert out.error is None and out.finish_reason == "stop", out
            got[int(out.request_id.rsplit("-", 1)[1])] = out.pooled
        core.scheduler.check_integrity()
    return got


def test_logits_match_transformers_batched_and_alone(llm, reference):
    batched = _logits(llm, PROMPTS, TOKENS)
    for i in range(len(PROMPTS)):
        tokens = TOKENS[i % len(TOKENS)]
        np.testing.assert_allclose(batched[i], reference[i][tokens], atol=1e-3)
        assert _logits(llm, [PROMPTS[i]], [tokens])[0] == pytest.approx(batched[i], abs=1e-6)


def test_cached_prefix_is_reused(llm, reference):
    """PROMPTS[2] shares its first 16 tokens (a block) with PROMPTS[0]."""
    _logits(llm, [PROMPTS[0]], TOKENS)
    before = llm.engine.scheduler.kv.num_hit_tokens
    got = _logits(llm, [PROMPTS[2]], TOKENS)[0]
    assert llm.engine.scheduler.kv.num_hit_tokens - before == 16
    np.testing.assert_allclose(got, reference[2][TOKENS[0]], atol=1e-3)


def test_bad_parameters_are_refused(llm):
    with pytest.raises(ValueError, match="needs last pooling"):
        PoolingParams(pooling="mean", logit_token_ids=[1])
    with pytest.raises(ValueError, match="non-empty list"):
        PoolingParams(logit_token_ids=[])
    with pytest.raises(ValueError, match="logit_token_ids must be in"):
        llm.engine.add_request(EngineCoreRequest(
            request_id="oov", prompt_token_ids=[1, 2], sampling_params=SamplingParams(),
            pooling_params=PoolingParams(logit_token_ids=[10**6])))
