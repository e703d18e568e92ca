"""Tensor parallel (distributed/tp_*.py) against one rank, on tiny random models whose heads
divide by 2: a Llama float folder (torch linears, Python layers) and a Qwen2 GGUF in Q4_0 (its
blocks as stored, split by rows and by whole blocks of columns; qkv biases split with their
rows; the native decoder layer in two halves), with the shared-memory all-reduce, and the Llama
once more over gloo (``--tp-all-reduce torch``).

The all-reduce changes the order of the row-parallel sums: float logits then differ by ~1e-6;
the block kernels round activations to 8 bits per block of 32, where a last-bit difference can
flip one rounding step, so Q4_0 logits differ by up to ~0.03 (measured; logits of magnitude
~3). A wrong split (rows, columns, heads, biases) moves them by O(1). Greedy tokens are compared
over each prompt's safe-margin prefix: the steps before the first one where TP=1's top-2 logit
margin falls under the model's margin (well above those differences). Within TP=2, a request
alone and in a batch must give the same tokens exactly.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch

from radixserve import LLM, SamplingParams
from radixserve.core.sched_output import ScheduledSeq
from radixserve.engine.tp.ranks import rank_cpus
from radixserve.kernels import native

NUM_TOKENS = 24
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [10, 20, 30, 40, 50], list(range(100, 160)),
           [7] * 3 + list(range(200, 230))]
# model → (logit tolerance, safe margin): measured differences ~2e-6 (float), 0.032 (Q4_0);
# a top-2 margin over twice the difference cannot flip
TOLERANCES = {"llama-float": (1e-4, 1e-3), "qwen2-Q4_0": (0.1, 0.07),
              "llama-float-gloo": (1e-4, 1e-3)}


def _models(tiny_hf_dirs, tiny_gguf_files):
    """name → (path, quantization, all-reduce)."""
    llama = str(tiny_hf_dirs["llama"])
    return {"llama-float": (llama, "none", "shm"),
            "qwen2-Q4_0": (str(tiny_gguf_files("qwen2", "Q4_0")), "gguf", "shm"),
            "llama-float-gloo": (llama, "none", "torch")}


@pytest.fixture(scope="module", params=list(TOLERANCES))
def pair(request, tiny_hf_dirs, tiny_gguf_files):
    """(TP=1, TP=2, (tolerance, margin)) on one model, one thread per rank."""
    path, quantization, all_reduce = _models(tiny_hf_dirs, tiny_gguf_files)[request.param]
    if quantization == "gguf" and native.load() is None:
        pytest.skip("blocks as stored need the native kernels")
    options = dict(num_kv_blocks=64, threads=1, quantization=quantization, show_progress=False)
    one = LLM(path, **options)
    two = LLM(path, tensor_parallel_size=2, tp_all_reduce=all_reduce, **options)
    assert two.engine.runner.group.comm.name == all_reduce
    yield one, two, TOLERANCES[request.param]
    two.close()


def _greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def _logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    """Every position's logits of ``ids`` fed as one prefill (its KV blocks freed after)."""
    engine = llm.engine
    pool = engine.scheduler.kv.block_pool
    blocks = pool.allocate(-(-len(ids) // engine.runner.block_size))
    try:
        (logits,) = engine.runner.all_logits([ScheduledSeq("logits", ids, 0, blocks, False)])
    finally:
        pool.free(blocks)
    return logits


def _margins(logits: torch.Tensor) -> torch.Tensor:
    top = logits.topk(2, dim=-1).values
    return top[:, 0] - top[:, 1]


def _safe_len(margins: list[float], margin: float) -> int:
    return next((k for k, m in enumerate(margins) if m < margin), len(margins))


def test_tp2_greedy_equals_tp1_over_the_safe_margin_prefix_and_logits_are_close(pair):
    """Generated tokens over each safe-margin prefix; and, fed TP=1's whole continuation,
    TP=2's logits within tolerance and its argmax TP=1's at every position with a safe
    margin (the random tiny models' margins are often small: that covers more ground)."""
    one, two, (atol, margin) = pair
    cfg_one, cfg_two = one.engine.runner.model.config, two.engine.runner.model.config
    assert (cfg_two.num_heads, cfg_two.num_kv_heads) == (cfg_one.num_heads // 2,
                                                         cfg_one.num_kv_heads // 2)
    num_prefix = num_safe = num_positions = 0
    for prompt, ours, theirs in zip(PROMPTS, _greedy(two, PROMPTS), _greedy(one, PROMPTS)):
        want = _logits(one, prompt + theirs)
        got = _logits(two, prompt + theirs)
        torch.testing.assert_close(got, want, atol=atol, rtol=0)
        margins = _margins(want)
        safe = margins >= margin
        assert torch.equal(got.argmax(-1)[safe], want.argmax(-1)[safe])
        num_safe, num_positions = num_safe + int(safe.sum()), num_positions + safe.numel()
        prefix = _safe_len(margins[len(prompt) - 1:-1].tolist(), margin)
        assert ours[:prefix] == theirs[:prefix], (prompt, prefix, ours, theirs)
        num_prefix += prefix
    assert num_prefix >= 12 and num_safe >= num_positions // 3  # real ground covered


def test_tp2_is_batch_invariant(pair):
    _, two, _ = pair
    together = _greedy(two, PROMPTS)
    alone = [_greedy(two, [p])[0] for p in PROMPTS]
    assert together == alone


def test_tp2_ranks_are_pinned_apart_and_count_their_all_reduces(pair):
    _, two, _ = pair
    group = two.engine.runner.group
    (worker,) = group.procs
    mine, theirs = os.sched_getaffinity(0), os.sched_getaffinity(worker.pid)
    if len(group.prior_cpus) >= 2:
        assert not mine & theirs, (mine, theirs)
    assert group.comm.num_calls > 0  # the steps went through its all-reduce


def test_a_size_that_does_not_divide_the_heads_names_the_valid_sizes():
    with pytest.raises(ValueError, match=r"9 attention heads, 3 KV heads.*valid sizes: 1, 3"):
        LLM(tensor_parallel_size=2, show_progress=False)


def test_more_ranks_than_cpus_share_them_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="radixserve.engine.tp.ranks"):
        assert rank_cpus([0, 1], 3) == [[0], [1], [0]]
    assert "3 ranks on 2 CPU(s) share them" in caplog.text
    assert rank_cpus([0, 1, 2, 3], 2) == [[0, 1], [2, 3]]


def test_a_shard_takes_rows_of_column_parallel_and_whole_blocks_of_row_parallel_matrices():
    from radixserve.models.tp_shard import TensorShard

    w = torch.arange(8 * 64.0).reshape(8, 64)
    one = TensorShard(1, 2)
    assert torch.equal(one.take("model.layers.0.self_attn.k_proj.weight", w), w[4:])
    assert torch.equal(one.take("layers.0.mlp.down_proj.weight", w), w[:, 32:])
    assert torch.equal(one.take("layers.0.self_attn.o_proj.bias", w[0]), torch.zeros(64))
    assert one.take("model.norm.weight", w) is w and one.take("lm_head.weight", w) is w
    raw = torch.arange(8 * 40, dtype=torch.int64).to(torch.uint8).reshape(8, 40)  # 2 blocks/row
    part, k = one.take_stored("layers.0.mlp.down_proj.weight", raw, 64, 32, 20)
    assert k == 32 and torch.equal(part, raw[:, 20:])
    part, k = one.take_stored("layers.0.mlp.gate_proj.weight", raw, 64, 32, 20)
    assert k == 64 and torch.equal(part, raw[4:])


def test_a_step_message_carries_what_the_forward_needs():
    from radixserve.engine.tp.runner import STOP, decode_step, encode_step

    seqs = [ScheduledSeq("a", [5, 6, 7], 0, [3], True),
            ScheduledSeq("b", [9, 1], 14, [0, 7], True, num_draft=1),
            ScheduledSeq("c", [4], 31, [2, 5], False)]
    back = decode_step(encode_step(seqs))
    assert [(s.token_ids, s.start_pos, s.block_ids, s.sample, s.num_draft) for s in back] == \
        [(s.token_ids, s.start_pos, s.block_ids, s.sample, s.num_draft) for s in seqs]
    assert decode_step(STOP) is None


def test_valid_sizes_divide_the_heads_and_keep_row_parallel_columns_whole_blocks():
    from radixserve.model_config import ModelConfig
    from radixserve.models.tp_shard import check_tp_size, valid_tp_sizes

    cfg = ModelConfig("LlamaForCausalLM", 1000, 1024, 2, 16, 8, 64, 2816)
    assert valid_tp_sizes(cfg) == [1, 2, 4, 8]
    assert valid_tp_sizes(cfg, 32) == [1, 2, 4, 8]  # Q4_0: 2816 / 8 = 352 = 11 blocks
    assert valid_tp_sizes(cfg, 256) == [1]  # K-quants: 2816 / 2 = 1408 is not whole blocks
    with pytest.raises(ValueError, match="supports dense"):
        check_tp_size(ModelConfig("Gemma3ForCausalLM", 1000, 1024, 2, 16, 8, 64, 2816), 2)
