"""Mixture-of-experts models (Qwen2-MoE with its shared expert, Qwen3-MoE, Mixtral): logits
against transformers through the paged KV cache (float, GGUF float, GGUF blocks as stored,
int8), experts batched by expert and only the picked ones run, a token's output independent of
the batch, the memory plan."""

from __future__ import annotations

import json

import pytest
import torch
from test_numerics import (ATOL, INT8_ATOL, PagedSeqs, _round_weights_as_int8_, hf_logits,
                           make_runner, prompts)
from tiny_moe import dequantized_reference, make_moe_hf_model
from transformers import AutoModelForCausalLM

from radixserve.kernels import native
from radixserve.layers.block_linear import BlockLinear
from radixserve.layers.int8_linear import Int8Linear
from radixserve.layers.moe import Expert, SparseMoeBlock
from radixserve.models.gguf_stored import memory_plan
from radixserve.models.loader import load_model_config, open_gguf
from radixserve.models.native_stack import NativeLayerStack, PythonLayerStack
from radixserve.models.source import ModelSource

ARCHS = ("qwen2_moe", "qwen3_moe", "mixtral")
MODEL_REL = 0.05  # blocks as stored: 8-bit activations (as test_block_linear.py)
ROUTE_GAP = 0.02  # a quantized router may pick otherwise only where two experts tie this near
needs_native = pytest.mark.skipif(native.load() is None, reason="native kernels unavailable")
# (sequence, tokens this step): prefill chunks beside one-token decodes
PLAN = [[(0, 6), (1, 1)], [(0, 5), (1, 7), (2, 1)], [(0, 1), (1, 1), (2, 4)],
        [(0, 1), (2, 1), (1, 8)]]


@pytest.fixture(scope="module")
def references(tiny_moe_files):
    return {arch: AutoModelForCausalLM.from_pretrained(tiny_moe_files(arch),
                                                       dtype=torch.float32).eval()
            for arch in ARCHS}


def check_steps(runner, reference, compare, seed=2):
    """Chunked prefill and decode steps of three sequences; ``compare(ours, theirs)``."""
    tokens = prompts(runner.config.vocab_size, lengths=(13, 17, 6), seed=seed)
    paged = PagedSeqs(tokens, seed=3)
    for step in PLAN:
        seqs = [paged.chunk(i, n) for i, n in step]
        for (i, _), seq, logits in zip(step, seqs, runner.all_logits(seqs)):
            full = hf_logits(reference, tokens[i][:seq.context_len])
            compare(logits, full[seq.start_pos:])


def close(atol):
    return lambda a, b: torch.testing.assert_close(a, b, atol=atol, rtol=0)


def relative(a, b):
    assert (a - b).abs().max() <= MODEL_REL * b.abs().max()


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_folder_matches_transformers(arch, tiny_moe_files, references):
    runner = make_runner(tiny_moe_files(arch))
    assert runner.config.moe.top_k == 2
    assert isinstance(runner.model.layers[0].mlp, SparseMoeBlock)
    check_steps(runner, references[arch], close(ATOL))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("ftype", ["F32", "F16"])
def test_float_gguf_matches_transformers(arch, ftype, tiny_moe_files):
    path = tiny_moe_files(arch, ftype)
    config = load_model_config(ModelSource.resolve(str(path)))
    assert config.architecture == {"qwen2_moe": "Qwen2MoeForCausalLM",
                                   "qwen3_moe": "Qwen3MoeForCausalLM",
                                   "mixtral": "MixtralForCausalLM"}[arch]
    check_steps(make_runner(path), dequantized_reference(tiny_moe_files(arch), path),
                close(ATOL))


def _assert_experts_stored(model):
    for layer in model.layers:
        moe = layer.mlp
        assert all(isinstance(e.gate_up_proj, BlockLinear) and isinstance(e.down_proj,
                                                                          BlockLinear)
                   for e in moe.experts)
        assert isinstance(moe.gate, Int8Linear)  # the F32 router: int8, like every float matrix
        if moe.shared_expert is not None:  # Qwen2-MoE: the shared expert as stored, its gate F32
            assert isinstance(moe.shared_expert.gate_up_proj, BlockLinear)
            assert isinstance(moe.shared_expert_gate, Int8Linear)
    assert all(p.dim() == 1 for p in model.parameters())  # no float matrix anywhere


class SameRoutes:
    """Run ``follower`` (a float model) on the experts ``leader`` (a quantized one) picked,
    call for call, with the follower's own router weights at those experts. Records, per
    routing decision the two models make differently, the follower's gap between the last
    picked and the first unpicked expert's probability."""

    def __init__(self, leader, follower) -> None:
        self.routes: dict[int, list[torch.Tensor]] = {}
        self.gaps: list[float] = []
        self.num_decisions = 0
        for li, (a, b) in enumerate(zip(leader.layers, follower.layers)):
            if isinstance(a.mlp, SparseMoeBlock):
                a.mlp.route = self._record(a.mlp, li)
                b.mlp.route = self._replay(b.mlp, li)

    def _record(self, block, li):
        original = block.route

        def route(x):
            weights, ids = original(x)
            self.routes.setdefault(li, []).append(ids)
            return weights, ids
        return route

    def _replay(self, block, li):
        def route(x):
            ids = self.routes[li].pop(0)
            probs = torch.softmax(block.gate(x).float(), dim=-1)
            own = torch.topk(probs, block.top_k + 1, dim=-1)
            differ = (own.indices[:, :block.top_k].sort(-1).values != ids.sort(-1).values)
            for row in differ.any(-1).nonzero()[:, 0].tolist():
                self.gaps.append(float(own.values[row, -2] - own.values[row, -1]))
            self.num_decisions += ids.shape[0]
            weights = probs.gather(1, ids)
            if block.norm_topk_prob:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            return weights, ids
        return route


@needs_native
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_0"])
def test_stored_gguf_matches_its_dequantized_weights(arch, ftype, tiny_moe_files):
    """Experts kept as the file's blocks (one BlockLinear per expert, gate and up fused)
    against the float model of the same file (= transformers on the dequantized weights, the
    test above and below) routed to the same experts: only the activations' rounding differs.
    The routing itself may differ only at near ties of the float router."""
    path = tiny_moe_files(arch, ftype)
    ours, ref = make_runner(path, quantization="gguf"), make_runner(path)
    _assert_experts_stored(ours.model)
    expert = ours.model.layers[1].mlp.experts[3]
    assert expert.gate_up_proj.types == (ftype,) and expert.gate_up_proj.out_features == 64
    routes = SameRoutes(ours.model, ref.model)
    tokens = prompts(ours.config.vocab_size, lengths=(13, 17, 6), seed=2)
    paged = {"ours": PagedSeqs(tokens), "ref": PagedSeqs(tokens)}
    for step in PLAN:
        a = ours.all_logits([paged["ours"].chunk(i, n) for i, n in step])
        b = ref.all_logits([paged["ref"].chunk(i, n) for i, n in step])
        for x, y in zip(a, b):
            relative(x, y)
    assert routes.num_decisions == 2 * sum(n for step in PLAN for _, n in step)
    assert len(routes.gaps) <= routes.num_decisions // 10, routes.gaps
    assert all(gap < ROUTE_GAP for gap in routes.gaps), routes.gaps


@pytest.mark.parametrize("arch", ARCHS)
def test_quantized_gguf_as_float_matches_transformers(arch, tiny_moe_files):
    path = tiny_moe_files(arch, "Q4_0")
    check_steps(make_runner(path), dequantized_reference(tiny_moe_files(arch), path),
                close(ATOL))


@needs_native
@pytest.mark.parametrize("arch", ARCHS)
def test_int8_requantizes_each_expert(arch, tiny_moe_files):
    runner = make_runner(tiny_moe_files(arch), quantization="int8")
    moe = runner.model.layers[0].mlp
    assert all(isinstance(e.gate_up_proj, Int8Linear) for e in moe.experts)
    ref = make_runner(tiny_moe_files(arch))
    _round_weights_as_int8_(ref.model)  # the router and every expert, rounded alike
    tokens = prompts(runner.config.vocab_size, lengths=(12, 7), seed=7)
    paged = {"int8": PagedSeqs(tokens), "ref": PagedSeqs(tokens)}
    for step in ([(0, 8), (1, 5)], [(0, 3), (1, 1)], [(0, 1), (1, 1)]):
        ours = runner.all_logits([paged["int8"].chunk(i, n) for i, n in step])
        theirs = ref.all_logits([paged["ref"].chunk(i, n) for i, n in step])
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b, atol=INT8_ATOL, rtol=0)


def test_qwen3_moe_dense_layers_and_unnormalized_weights(tmp_path):
    """``mlp_only_layers`` / ``decoder_sparse_step`` keep dense MLPs; norm_topk_prob false."""
    path = make_moe_hf_model("qwen3_moe", tmp_path / "m", seed=3, num_hidden_layers=3,
                             mlp_only_layers=[0], decoder_sparse_step=1, norm_topk_prob=False)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    runner = make_runner(path)
    kinds = [type(layer.mlp).__name__ for layer in runner.model.layers]
    assert kinds == ["MLP", "SparseMoeBlock", "SparseMoeBlock"]
    assert runner.config.moe.dense_layers == (0,) and not runner.config.moe.norm_topk_prob
    check_steps(runner, reference, close(ATOL))


@needs_native
def test_stored_moe_takes_the_python_stack(tiny_moe_files):
    model = make_runner(tiny_moe_files("mixtral", "Q8_0"), quantization="gguf").model
    assert isinstance(NativeLayerStack.build(model), PythonLayerStack)


@needs_native
@pytest.mark.parametrize("arch", ARCHS)
def test_token_output_is_independent_of_the_batch(arch, tiny_moe_files):
    """Bit for bit: each token through the MoE block alone, in the whole batch and in a
    shuffled one; then a sequence's logits alone and beside others, prefill and decode."""
    runner = make_runner(tiny_moe_files(arch, "Q8_0"), quantization="gguf")
    block = runner.model.layers[0].mlp
    x = torch.randn(40, 64, generator=torch.Generator().manual_seed(0))
    full = block(x)
    perm = torch.randperm(40, generator=torch.Generator().manual_seed(1))
    assert torch.equal(block(x[perm]), full[perm])
    assert all(torch.equal(block(x[i:i + 1])[0], full[i]) for i in range(40))

    tokens = prompts(runner.config.vocab_size, lengths=(9, 14, 5, 11), seed=8)
    alone, together = PagedSeqs(tokens[:1]), PagedSeqs(tokens)
    (a,) = runner.all_logits([alone.chunk(0, 9)])
    b = runner.all_logits([together.chunk(i, len(t)) for i, t in enumerate(tokens)])[0]
    assert torch.equal(a, b)
    alone.tokens[0].append(17)
    for t in together.tokens:
        t.append(17)
    (a,) = runner.all_logits([alone.chunk(0, 1)])
    b = runner.all_logits([together.chunk(i, 1) for i in range(len(tokens))])[0]
    assert torch.equal(a, b)


def test_only_the_picked_experts_run(tiny_moe_files):
    """A decode step of one token runs top_k experts per MoE layer on one row each; a prefill
    runs each expert at most once, on all the rows routed to it."""
    runner = make_runner(tiny_moe_files("qwen3_moe"))
    calls: list[tuple[int, int]] = []
    for li, layer in enumerate(runner.model.layers):
        for expert in layer.mlp.experts:
            expert.register_forward_pre_hook(
                lambda m, args, li=li: calls.append((li, args[0].shape[0])))
    tokens = prompts(runner.config.vocab_size, lengths=(10,), seed=9)
    paged = PagedSeqs(tokens)
    runner.all_logits([paged.chunk(0, 9)])
    assert sum(rows for _, rows in calls) == 9 * 2 * 2  # every (token, rank) once, 2 layers
    assert len(calls) <= 8 * 2
    calls.clear()
    runner.all_logits([paged.chunk(0, 1)])
    assert sorted(calls) == [(0, 1), (0, 1), (1, 1), (1, 1)]


@needs_native
@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_0"])
def test_memory_plan_counts_expert_tensors(ftype, tiny_moe_files):
    path = tiny_moe_files("qwen3_moe", ftype)
    reader = open_gguf(str(path))
    plan = memory_plan((t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape)))
                       for t in reader.tensors)
    model = make_runner(path, quantization="gguf").model
    packed = sum(b.numel() for m in model.modules() if isinstance(m, BlockLinear)
                 for name, b in m.named_buffers() if name.startswith("packed"))
    assert plan.weights == packed
    assert plan.file == sum(int(t.n_bytes) for t in reader.tensors)
    # the largest layer at load: one expert's gate and up rows (or attention's q/k/v)
    assert 0 < plan.transient


def test_bad_moe_configs_are_refused(tmp_path, tiny_moe_files):
    folder = tmp_path / "bad"
    folder.mkdir()
    cfg = json.loads((tiny_moe_files("mixtral") / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(cfg, num_experts_per_tok=5)))
    with pytest.raises(ValueError, match="experts per token must be in 1..4"):
        load_model_config(ModelSource("hf", str(folder), "bad"))


def test_qwen2_moe_config_from_folder_and_gguf(tiny_moe_files):
    """The shared expert's width, q/k/v bias and the top-k weights left unnormalized (Qwen1.5-MoE's
    norm_topk_prob false, llama.cpp's qwen2moe default), from config.json and GGUF alike."""
    for path in (tiny_moe_files("qwen2_moe"), tiny_moe_files("qwen2_moe", "F16")):
        config = load_model_config(ModelSource.resolve(str(path)))
        assert config.architecture == "Qwen2MoeForCausalLM" and config.attention_bias
        assert config.moe.shared_expert_size == 64 and not config.moe.norm_topk_prob
    assert load_model_config(ModelSource.resolve(str(tiny_moe_files("qwen3_moe", "F16")))
                             ).moe.shared_expert_size == 0


def test_qwen2_moe_normalized_top_k_matches_transformers(tmp_path):
    """norm_topk_prob true (Qwen2-MoE configs may set it), written to GGUF as
    expert_weights_norm: both against transformers."""
    from tiny_moe import moe_hf_to_gguf

    path = make_moe_hf_model("qwen2_moe", tmp_path / "m", seed=5, norm_topk_prob=True)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    runner = make_runner(path)
    assert runner.config.moe.norm_topk_prob
    check_steps(runner, reference, close(ATOL))
    gguf_path = moe_hf_to_gguf(path, tmp_path / "m.gguf", "F32")
    assert load_model_config(ModelSource.resolve(str(gguf_path))).moe.norm_topk_prob


def test_shared_expert_runs_on_every_token_gated():
    from radixserve.model_config import MoeConfig

    block = SparseMoeBlock(8, MoeConfig(4, 2, 4, shared_expert_size=6))
    plain = SparseMoeBlock(8, MoeConfig(4, 2, 4))
    plain.load_state_dict({k: v for k, v in block.state_dict().items() if "shared" not in k})
    x = torch.randn(5, 8)
    gate = torch.sigmoid(x @ block.shared_expert_gate.weight.t())
    torch.testing.assert_close(block(x), plain(x) + gate * block.shared_expert(x))


def test_expert_module_is_the_dense_swiglu():
    expert = Expert(8, 4)
    x = torch.randn(3, 8)
    gate, up = (x @ expert.gate_up_proj.weight.t()).chunk(2, dim=-1)
    want = (torch.nn.functional.silu(gate) * up) @ expert.down_proj.weight.t()
    torch.testing.assert_close(expert(x), want)
