"""The sigmoid (DeepSeek-V3-style) routers of layers/moe.py against transformers' own: Nemotron-H's
(grouped selection, a correction bias, routed scaling, renormalized with 1e-20) and LFM2-MoE's
(an expert bias, renormalized with 1e-6); relu2 experts; a token's routing independent of its
batch with the scalar sigmoid."""

from __future__ import annotations

import pytest
import torch
from transformers.models.lfm2_moe.configuration_lfm2_moe import Lfm2MoeConfig
from transformers.models.lfm2_moe.modeling_lfm2_moe import Lfm2MoeTopKRouter
from transformers.models.nemotron_h.configuration_nemotron_h import NemotronHConfig
from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHTopkRouter

from radixserve.kernels import native
from radixserve.layers.moe import Relu2Expert, SparseMoeBlock
from radixserve.model_config import MoeConfig

HIDDEN, EXPERTS, TOP_K = 32, 16, 4


def _block(**fields) -> SparseMoeBlock:
    block = SparseMoeBlock(HIDDEN, MoeConfig(EXPERTS, TOP_K, 8, **fields))
    torch.nn.init.normal_(block.gate.weight, std=0.3)
    if block.expert_bias is not None:
        block.expert_bias.data.normal_(std=0.2)
    return block


class _RowByRow(torch.nn.Module):
    """``linear`` applied to one row at a time."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.linear(row[None]) for row in x])


def _sorted(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, ids) in expert order per row (transformers' top-k is unsorted)."""
    order = ids.argsort(dim=-1)
    return weights.gather(1, order), ids.gather(1, order)


@pytest.mark.parametrize("groups,keep", [(1, 1), (4, 2)])
def test_nemotron_h_router(groups, keep):
    torch.manual_seed(0)
    ours = _block(scoring="sigmoid", expert_bias=True, num_groups=groups, topk_groups=keep,
                  routed_scaling=2.5, norm_eps=1e-20)
    cfg = NemotronHConfig(hidden_size=HIDDEN, n_routed_experts=EXPERTS, num_experts_per_tok=TOP_K,
                          n_group=groups, topk_group=keep, routed_scaling_factor=2.5,
                          norm_topk_prob=True)
    theirs = NemotronHTopkRouter(cfg)
    theirs.weight.data.copy_(ours.gate.weight.data)
    theirs.e_score_correction_bias.copy_(ours.expert_bias.data)
    x = torch.randn(40, HIDDEN)
    _, want_w, want_ids = theirs(x)
    got_w, got_ids = ours.route(x)
    want_w, want_ids = _sorted(want_w, want_ids)
    got_w, got_ids = _sorted(got_w, got_ids)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w, atol=1e-6, rtol=1e-5)


def test_lfm2_moe_router():
    torch.manual_seed(1)
    ours = _block(scoring="sigmoid", expert_bias=True, norm_eps=1e-6)
    cfg = Lfm2MoeConfig(hidden_size=HIDDEN, num_experts=EXPERTS, num_experts_per_tok=TOP_K,
                        use_expert_bias=True, norm_topk_prob=True, routed_scaling_factor=1.0)
    theirs = Lfm2MoeTopKRouter(cfg)
    theirs.weight.data.copy_(ours.gate.weight.data)
    x = torch.randn(40, HIDDEN)
    _, want_w, want_ids = theirs(x, ours.expert_bias.data)
    got_w, got_ids = ours.route(x)
    want_w, want_ids = _sorted(want_w, want_ids)
    got_w, got_ids = _sorted(got_w, got_ids)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w, atol=1e-6, rtol=1e-5)


def test_relu2_experts_and_an_ungated_shared_expert():
    torch.manual_seed(2)
    block = SparseMoeBlock(HIDDEN, MoeConfig(EXPERTS, TOP_K, 8, scoring="sigmoid",
                                             expert_activation="relu2", shared_expert_size=12,
                                             shared_expert_gate=False))
    assert isinstance(block.experts[0], Relu2Expert) and block.shared_expert_gate is None
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(5, HIDDEN)
    weights, ids = block.route(x)
    want = block.shared_expert(x).clone()
    for t in range(5):
        for r in range(TOP_K):
            e = block.experts[int(ids[t, r])]
            want[t] += weights[t, r] * e.down_proj(torch.relu(e.up_proj(x[t])) ** 2)
    torch.testing.assert_close(block(x), want, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(native.load() is None, reason="the scalar sigmoid is a native kernel")
def test_sigmoid_routing_does_not_depend_on_the_batch():
    torch.manual_seed(3)
    block = _block(scoring="sigmoid", expert_bias=True, num_groups=4, topk_groups=2)
    block.native = True
    # the router one row at a time: a float linear's bits depend on the batch (the native
    # quantized linears' do not), and this tests what follows it
    block.gate = _RowByRow(block.gate)
    x = torch.randn(37, HIDDEN)
    full_w, full_ids = block.route(x)
    for t in (0, 17, 36):
        w, ids = block.route(x[t:t + 1])
        assert torch.equal(ids[0], full_ids[t]) and torch.equal(w[0], full_w[t])


def test_bad_moe_configs_are_refused():
    with pytest.raises(ValueError, match="scoring"):
        MoeConfig(8, 2, 4, scoring="tanh")
    with pytest.raises(ValueError, match="activation"):
        MoeConfig(8, 2, 4, expert_activation="gelu")
    with pytest.raises(ValueError, match="groups"):
        MoeConfig(8, 2, 4, num_groups=3)
