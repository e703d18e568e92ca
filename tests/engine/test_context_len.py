"""The context length: the model's window capped by the KV pool (engine/context_len.py), the
default max_tokens filling what the prompt leaves, and the refusals that name the numbers."""

from __future__ import annotations

import logging

import pytest
from tiny_models import make_hf_model

from radixserve import LLM, SamplingParams
from radixserve.model_config import ModelConfig
from radixserve.engine.context_len import resolve_max_model_len

BLOCKS, BLOCK = 16, 4  # a 64-token pool; the tiny model's window is 512


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_hf_model("llama", tmp_path_factory.mktemp("ctx") / "m", seed=3)


@pytest.fixture(scope="module")
def small_pool_llm(tiny_dir):
    return LLM(str(tiny_dir), num_kv_blocks=BLOCKS, block_size=BLOCK, show_progress=False)


def _config(**kw) -> ModelConfig:
    return ModelConfig("LlamaForCausalLM", 384, 64, 2, 4, 2, 16, 128, **kw)


def test_window_capped_by_the_pool_and_logged(caplog):
    with caplog.at_level(logging.INFO, logger="radixserve.engine.context_len"):
        assert resolve_max_model_len(None, _config(max_position_embeddings=512), 16, 4) == 64
    (line,) = [r.getMessage() for r in caplog.records]
    assert "max_model_len 64" in line and "window 512" in line and "holds 64 tokens" in line
    # a pool larger than the window: the window (a linear-scaled one: factor x positions)
    scaled = _config(max_position_embeddings=100,
                     rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert resolve_max_model_len(None, scaled, 1000, 16) == 200


def test_explicit_length_checked_against_window_and_pool():
    cfg = _config(max_position_embeddings=512)
    assert resolve_max_model_len(32, cfg, 16, 4) == 32
    with pytest.raises(ValueError, match=r"max_model_len=100 exceeds what the KV pool holds "
                                         r"\(64 tokens: 16 blocks of 4\)"):
        resolve_max_model_len(100, cfg, 16, 4)
    with pytest.raises(ValueError, match=r"max_model_len=600 exceeds the model's context "
                                         r"window \(512\)"):
        resolve_max_model_len(600, cfg, 1000, 4)


def test_sliding_window_does_not_shorten_the_context():
    cfg = _config(max_position_embeddings=512, sliding_window=40)
    assert resolve_max_model_len(None, cfg, 1000, 4) == 512
    assert resolve_max_model_len(100, cfg, 1000, 4) == 100


def test_llm_request_without_max_tokens_fills_the_context(small_pool_llm):
    assert small_pool_llm.engine.max_model_len == BLOCKS * BLOCK
    assert small_pool_llm.engine.runner.model.rotary.cos.shape[0] == BLOCKS * BLOCK
    prompt = list(range(10, 30))
    (out,) = small_pool_llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=None,
                                                            ignore_eos=True))
    assert len(out.outputs[0].token_ids) == 64 - 20
    assert out.outputs[0].finish_reason == "length"


def test_llm_refuses_a_prompt_that_fills_the_context(small_pool_llm):
    with pytest.raises(ValueError, match="the prompt has 64 tokens; the context window is 64"):
        small_pool_llm.generate(list(range(64)), SamplingParams(max_tokens=1))
    # max_tokens past the context is clipped to it, as for the default
    (out,) = small_pool_llm.generate(list(range(60)), SamplingParams(
        temperature=0.0, max_tokens=50, ignore_eos=True))
    assert len(out.outputs[0].token_ids) == 4


def test_llm_refuses_an_explicit_length_over_the_pool(tiny_dir):
    with pytest.raises(ValueError, match="max_model_len=100 exceeds what the KV pool holds"):
        LLM(str(tiny_dir), num_kv_blocks=BLOCKS, block_size=BLOCK, max_model_len=100,
            show_progress=False)
