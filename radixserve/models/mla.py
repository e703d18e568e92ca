"""Multi-head latent attention (DeepSeek-V2 / V3, GLM-4.7-Flash), in the absorbed form.

transformers' layer, per token (H heads; ``MlaParams`` names the widths)::

    q        = q_b(norm(q_a(x)))  or  q_proj(x)        [H, nope + rope]
    c, kr    = kv_a_proj_with_mqa(x)                   [kv_lora_rank], [rope]: one per token
    c        = kv_a_layernorm(c)
    k_h, v_h = kv_b_proj(c) split per head             [nope], [v]   (k_b_h [nope, L], v_b_h [v, L])
    k_h      = [k_h | rope(kr)],  q_h = [q_nope_h | rope(q_rope_h)]
    o_h      = softmax(q_h . k_h * scale) . v_h;       y = o_proj([o_1 .. o_H])

Since q_nope_h . k_b_h c = (k_b_h^T q_nope_h) . c, each head's query is taken into the latent
space once (``q_lat_h = k_b_h^T q_nope_h``), the scores become ``[q_lat_h | q_rope_h] .
[c | kr]`` against ONE row per token shared by all heads, and o_h = v_b_h (softmax . c): the
cache holds that row, ``kv_lora_rank + rope`` elements per token and layer (models/
mla_paged.py attends over it). The result equals transformers' up to float rounding (the
products are reassociated).

DeepSeek's rope rotates adjacent pairs (``rope_interleave``); its dims are de-interleaved
first (x0, x2, .. | x1, x3, ..), which turns that rotation into the rotate-half one of
layers/rotary.py, applied to q and k alike (the dot product is unchanged by the reorder).
"""

from __future__ import annotations

import torch
from torch import nn

from radixserve.layers.forward_context import get_forward_context
from radixserve.layers.norm import RMSNorm
from radixserve.layers.rotary import RotaryEmbedding
from radixserve.model_config import MlaParams, ModelConfig
from radixserve.models.mla_paged import latent_attention


class LatentExpansion(nn.Module):
    """``kv_b_proj``: [H * (nope + v), kv_lora_rank], read per head as k_b [H, nope, L] and
    v_b [H, v, L] (a plain parameter, not a linear: the absorbed form never applies it to c)."""

    def __init__(self, heads: int, mla: MlaParams) -> None:
        super().__init__()
        self.heads, self.nope, self.v = heads, mla.qk_nope_head_dim, mla.v_head_dim
        self.weight = nn.Parameter(torch.empty(heads * (self.nope + self.v), mla.kv_lora_rank),
                                   requires_grad=False)

    def per_head(self) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.weight.view(self.heads, self.nope + self.v, -1)
        return w[:, :self.nope], w[:, self.nope:]


class MlaAttention(nn.Module):
    """x [T, hidden] → [T, hidden] over the pool layer ``layer_idx`` (module docstring)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        mla = cfg.mla
        self.layer_idx, self.mla, self.num_heads = layer_idx, mla, cfg.num_heads
        qk_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        bias = cfg.attention_bias
        if mla.q_lora_rank is None:
            self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * qk_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(cfg.hidden_size, mla.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, cfg.rms_norm_eps)
            self.q_b_proj = nn.Linear(mla.q_lora_rank, cfg.num_heads * qk_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size,
                                            mla.kv_lora_rank + mla.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = LatentExpansion(cfg.num_heads, mla)
        self.o_proj = nn.Linear(cfg.num_heads * mla.v_head_dim, cfg.hidden_size, bias=bias)
        self.rotary = rotary

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        mla, num_tokens = self.mla, x.shape[0]
        if mla.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(num_tokens, self.num_heads, -1)
        q_nope, q_rope = q.split((mla.qk_nope_head_dim, mla.qk_rope_head_dim), dim=-1)
        c, k_rope = self.kv_a_proj_with_mqa(x).split(
            (mla.kv_lora_rank, mla.qk_rope_head_dim), dim=-1)
        c = self.kv_a_layernorm(c.contiguous())
        q_rope, k_rope = self.rotary(positions, self._rope_order(q_rope),
                                     self._rope_order(k_rope.unsqueeze(1)))
        k_b, v_b = self.kv_b_proj.per_head()
        # a quantized model's linears are native, each row's bits its own: keep them so here
        exact = x.device.type == "cpu" and not isinstance(self.o_proj, nn.Linear)
        q_lat = head_products(q_nope, k_b, exact)  # q_lat[t, h] = k_b[h]^T q_nope[t, h]
        ctx = get_forward_context()
        o_lat = latent_attention(torch.cat((q_lat, q_rope), dim=-1),
                                 torch.cat((c, k_rope.squeeze(1)), dim=-1),
                                 ctx.kv_caches[self.layer_idx][0],
                                 ctx.layer_metadata[self.layer_idx], mla.softmax_scale,
                                 mla.kv_lora_rank, exact)
        o = head_products(o_lat, v_b.transpose(1, 2), exact)  # o[t, h] = v_b[h] o_lat[t, h]
        return self.o_proj(o.reshape(num_tokens, -1))

    def _rope_order(self, x: torch.Tensor) -> torch.Tensor:
        """The rope dims of ``x`` [T, heads, rope], contiguous, in rotate-half order."""
        if not self.mla.rope_interleave:
            return x.contiguous()
        return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


# rows per product where each row's bits must be its own: decode pays (ROW_TILE - 1) wasted
# rows, a prefill reads k_b / v_b once per ROW_TILE rows
ROW_TILE = 4


def head_products(x: torch.Tensor, w: torch.Tensor, exact: bool) -> torch.Tensor:
    """x [T, H, n] → [T, H, m], row t of head h times w[h] [n, m].

    NOTE: a CPU sgemm's row bits change with the number of rows M, so where ``exact`` (a
    quantized model on the CPU, whose native linears give a row the same bits in any batch)
    the rows go through in tiles of ``ROW_TILE``, the last one zero-padded: every row meets
    the same [H, ROW_TILE, n] x [H, n, m] product whatever its batch or chunk. Else one
    product (a float model's torch linears are not row-invariant either)."""
    x = x.transpose(0, 1)  # [H, T, n]
    if not exact:
        return torch.bmm(x, w).transpose(0, 1)
    num_rows = x.shape[1]
    padded = -(-num_rows // ROW_TILE) * ROW_TILE
    if padded != num_rows:
        x = torch.cat((x, x.new_zeros(x.shape[0], padded - num_rows, x.shape[2])), dim=1)
    tiles = [torch.bmm(x[:, i:i + ROW_TILE], w) for i in range(0, padded, ROW_TILE)]
    return torch.cat(tiles, dim=1)[:, :num_rows].transpose(0, 1)
