"""Tiny models whose every matrix (embedding and head included) is of one tile type, loaded as
stored: their logits against the float model on the same file dequantized by gguf-py, through
chunked prefill and decode; the embedding's rows and the load's memory plan; greedy output the
same alone, batched and in chunks; MXFP4 experts (gpt-oss's MXFP4_MOE files). A representative
few types (a K-quant, the 4-bit codebook in blocks of 256, a 2-bit codebook, MXFP4, ternary);
test_tile_types.py covers every type's kernel. The weights are random rows (tile_gguf.py): a
random model is as good as any where both sides read the same file."""

from __future__ import annotations

from dataclasses import replace

import gguf
import pytest
import torch
from test_block_linear import MODEL_REL, _assert_stored, _compare_steps
from test_moe import PLAN, ROUTE_GAP, SameRoutes, relative
from test_numerics import PagedSeqs, make_runner, prompts
from tile_gguf import with_random_matrices
from tiny_models import hf_to_gguf, make_hf_model

from radixserve import LLM, SamplingParams
from radixserve.kernels import native
from radixserve.layers.block_linear import BlockLinear
from radixserve.layers.gguf_quant import dequantize
from radixserve.models.gguf_stored import memory_plan

T = gguf.GGMLQuantizationType
needs_native = pytest.mark.skipif(native.load() is None, reason="native kernels unavailable")
# (arch, type): llama's Q/K rows unpermuted, qwen2's head tied to the embedding (the head's
# packed rows read back), qwen3's q/k norms
MODELS = [("llama", T.Q3_K), ("qwen2", T.IQ4_XS), ("llama", T.IQ2_XXS), ("qwen3", T.MXFP4),
          ("qwen2", T.TQ1_0)]


@pytest.fixture(scope="module")
def tile_files(tmp_path_factory):
    """(arch, type) → a GGUF of a tiny model wide enough for 256-weight blocks (hidden 256),
    every 2-D tensor random rows of the type; built on first use."""
    root = tmp_path_factory.mktemp("tile_models")
    bases, files = {}, {}

    def get(arch, qtype):
        if arch not in bases:
            hf = make_hf_model(arch, root / arch, hidden_size=256, intermediate_size=512,
                               head_dim=64, tie_word_embeddings=arch == "qwen2")
            bases[arch] = hf_to_gguf(hf, root / f"{arch}.gguf", "F32")
        if (arch, qtype) not in files:
            files[arch, qtype] = with_random_matrices(
                bases[arch], root / f"{arch}-{qtype.name}" / "model.gguf", qtype)
        return files[arch, qtype]
    return get


def _tensor_table(path):
    return [(t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape)))
            for t in gguf.GGUFReader(str(path)).tensors]


@needs_native
@pytest.mark.parametrize("arch, qtype", MODELS, ids=lambda v: getattr(v, "name", v))
def test_tile_model_matches_its_dequantized_weights(arch, qtype, tile_files):
    """The float model holds gguf-py's dequantized weights, exactly those the tile layers
    read: only the activations' 8-bit rounding differs. The embedding's rows (the head's
    packed rows where tied) are the table dequantized, and the memory plan is what loads."""
    path = tile_files(arch, qtype)
    ours, ref = make_runner(path, quantization="gguf"), make_runner(path)
    model = ours.model
    _assert_stored(model)
    layers = [m for m in model.modules() if isinstance(m, BlockLinear)]
    assert {m.types for m in layers} == {(qtype.name,)}
    _compare_steps(ours, ref, MODEL_REL)

    embd = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == "token_embd.weight")
    table = dequantize(embd.data, embd.tensor_type, (model.config.vocab_size, 256))
    ids = torch.tensor([0, 5, 5, 17, 383])
    assert torch.equal(model.embed_tokens(ids), table[ids])
    assert torch.equal(model.embed_tokens.weight, table)
    plan = memory_plan(_tensor_table(path))
    assert plan.by_type == {qtype.name: sum(b.numel() for m in layers for b in m.buffers()
                                            if b.dtype == torch.uint8)}
    assert plan.embedding == (0 if arch == "qwen2" else int(embd.n_bytes))  # tied: the head's


PROMPTS = [[5, 17, 33, 101, 7, 250, 9, 64, 12], [3, 1, 4, 1, 5, 9, 2, 6],
           [(31 * i + 7) % 380 + 1 for i in range(21)], [42]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def _greedy(llm, prompts):
    return [list(r.outputs[0].token_ids) for r in llm.generate(prompts, GREEDY)]


@needs_native
def test_tile_model_greedy_is_the_same_alone_batched_chunked_and_cached(tile_files):
    """IQ4_XS: each prompt alone, all together, in prefill chunks of 5 tokens beside the
    others' decode steps, and again from the prefix cache: the same tokens."""
    llm = LLM(str(tile_files("qwen2", T.IQ4_XS)), num_kv_blocks=128, show_progress=False)
    alone = [_greedy(llm, [p])[0] for p in PROMPTS]
    assert _greedy(llm, PROMPTS) == alone
    sched = llm.engine.scheduler
    budget = sched.config.max_num_batched_tokens
    sched.config = replace(sched.config, max_num_batched_tokens=5)
    try:
        assert _greedy(llm, PROMPTS) == alone
    finally:
        sched.config = replace(sched.config, max_num_batched_tokens=budget)
    cached = llm.generate(PROMPTS, GREEDY)
    assert [list(r.outputs[0].token_ids) for r in cached] == alone
    assert any(r.num_cached_tokens > 0 for r in cached)


@needs_native
def test_mxfp4_experts_match_their_dequantized_weights(tiny_moe_files, tmp_path):
    """A tiny Qwen3-MoE all in MXFP4 (its widths are multiples of MXFP4's block of 32): each
    expert one BlockLinear on the file's blocks, against the float model of the same file routed
    to the same experts (test_moe.py's check: routes may differ only at near ties)."""
    path = with_random_matrices(tiny_moe_files("qwen3_moe", "F32"), tmp_path / "moe.gguf",
                                T.MXFP4)
    ours, ref = make_runner(path, quantization="gguf"), make_runner(path)
    expert = ours.model.layers[1].mlp.experts[3]
    assert expert.gate_up_proj.types == expert.down_proj.types == ("MXFP4",)
    routes = SameRoutes(ours.model, ref.model)
    tokens = prompts(ours.config.vocab_size, lengths=(13, 17, 6), seed=2)
    paged = {"ours": PagedSeqs(tokens), "ref": PagedSeqs(tokens)}
    for step in PLAN:
        a = ours.all_logits([paged["ours"].chunk(i, n) for i, n in step])
        b = ref.all_logits([paged["ref"].chunk(i, n) for i, n in step])
        for x, y in zip(a, b):
            relative(x, y)
    assert len(routes.gaps) <= routes.num_decisions // 10, routes.gaps
    assert all(gap < ROUTE_GAP for gap in routes.gaps), routes.gaps
