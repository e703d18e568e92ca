"""Generation ends at every end-of-generation token of the vocabulary, not only the eos the
metadata names: on a Qwen-like tiny model (eos ``<|im_end|>``), a request stops at
``<|endoftext|>`` and at ``<|fim_pad|>``, and ``ignore_eos`` ignores them all."""

from __future__ import annotations

import pytest
from tiny_fim import ENDOFTEXT, IM_END, PAD, make_fim_gguf, make_fim_hf_model

from radixserve import LLM
from radixserve.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    root = tmp_path_factory.mktemp("eog")
    gguf = make_fim_gguf(make_fim_hf_model(root / "hf"), root / "gguf" / "fim.gguf")
    return LLM(str(gguf), num_kv_blocks=64, max_num_seqs=4, show_progress=False)


@pytest.mark.parametrize("token", [ENDOFTEXT, PAD, IM_END])
def test_stops_at_each_end_token(llm, token):
    forced = SamplingParams(max_tokens=8, temperature=0.0, logit_bias={token: 100.0})
    (out,) = llm.generate([[10, 20, 30]], forced)
    assert out.outputs[0].token_ids == [token]
    assert out.outputs[0].finish_reason == "stop"


def test_ignore_eos_ignores_every_end_token(llm):
    forced = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True,
                            logit_bias={ENDOFTEXT: 100.0})
    (out,) = llm.generate([[10, 20, 30]], forced)
    assert out.outputs[0].token_ids == [ENDOFTEXT] * 5
    assert out.outputs[0].finish_reason == "length"
