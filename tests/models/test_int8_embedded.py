"""The embedded SmolLM2 GGUF (Q4_1) runs int8 by default; its logits stay close to the float
model's on real text."""

from __future__ import annotations

import pytest
import torch

from radixserve.core.sched_output import ScheduledSeq
from radixserve.layers.int8_linear import Int8Linear
from radixserve.models.quantization import cpu_has_int8_dot

TEXT = (
    "The paged KV cache splits every sequence's keys and values into fixed-size blocks, so "
    "memory is handed out a block at a time and shared prefixes are stored once. A radix tree "
    "over token ids finds the longest cached prefix of a new prompt; blocks nobody holds are "
    "evicted least recently used first. def reverse(items):\n    return items[::-1]\n"
    "Paris is the capital of France, and Berlin is the capital of Germany."
)


def _logits(llm, token_ids: list[int]) -> torch.Tensor:
    """All-position logits through the engine's runner, on blocks borrowed from its pool."""
    pool = llm.engine.scheduler.kv.block_pool
    blocks = pool.allocate(-(-len(token_ids) // llm.engine.runner.block_size))
    try:
        seq = ScheduledSeq("logits", token_ids, 0, blocks, sample=False)
        return llm.engine.runner.all_logits([seq])[0]
    finally:
        pool.free(blocks)


@pytest.fixture(scope="module")
def float_llm():
    from radixserve import LLM

    return LLM(quantization="none", show_progress=False)


@pytest.mark.skipif(not cpu_has_int8_dot(), reason="int8 needs a CPU with VNNI")
def test_embedded_model_is_int8_and_close_to_float(embedded_llm, float_llm):
    assert isinstance(embedded_llm.engine.runner.model.layers[0].self_attn.qkv_proj, Int8Linear)
    assert isinstance(embedded_llm.engine.runner.model.lm_head, Int8Linear)
    assert isinstance(float_llm.engine.runner.model.layers[0].mlp.down_proj, torch.nn.Linear)
    ids = embedded_llm.get_tokenizer().encode(TEXT)
    ours, ref = _logits(embedded_llm, ids), _logits(float_llm, ids)
    log_p, log_q = torch.log_softmax(ref, -1), torch.log_softmax(ours, -1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    agree = (ours.argmax(-1) == ref.argmax(-1)).float().mean()
    # measured: KL 0.006 mean, top-1 agreement 0.94 (one-term W8A8 would give 0.056, 0.85)
    assert kl.mean() < 0.02 and agree > 0.88
    targets = torch.tensor(ids[1:])
    nll = [-lp[:-1].gather(1, targets[:, None]).mean() for lp in (log_q, log_p)]
    assert nll[0] < nll[1] * 1.02
