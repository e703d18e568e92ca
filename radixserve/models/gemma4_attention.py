"""Gemma 4's attention (models/gemma4.py's layers use it): q and k RMS-normed per head, v
normed without a weight, scale 1; sliding layers (window, rope base ``rope_local_theta``)
beside global ones (heads of ``kv_shapes``' width, proportional rope, values from the key
projection where ``k_eq_v``).

Shared KV: a shared-KV layer (``ModelConfig.kv_source``) computes only its queries and attends
over its source layer's KV: it passes the source's K/V rows of this step (``SharedKV``) to the
backend with the source's pool layer, so the backend's write rewrites the values already
there (both backends always write first).

Pool views: the KV pool's rows are the widest layer's (``ModelConfig.kv_view``); a narrower
layer views the same row as more heads of its own dim and repeats each KV head into them
(query head i still meets KV head ``i // (heads / kv_heads)``: exact), zero-padding its heads
where the row has more of them than it has query heads (``_pool_heads``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from radixserve.layers.forward_context import get_forward_context
from radixserve.layers.norm import RMSNorm
from radixserve.layers.rotary import RotaryEmbedding
from radixserve.model_config import ModelConfig

# K/V rows of this step by pool layer, for the shared-KV layers after their source
SharedKV = dict[int, tuple[torch.Tensor, torch.Tensor]]


def _unit_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS norm without a weight (Gemma 4's value norm), in float32 as transformers does."""
    xf = x.float()
    return (xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + eps, -0.5)).to(x.dtype)


def _rotate(rotary: RotaryEmbedding, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``x`` [T, heads, d] rotated alone (a shared-KV layer's queries; "rotate half" layout)."""
    cos = rotary.cos[positions].unsqueeze(1).to(x.dtype)
    sin = rotary.sin[positions].unsqueeze(1).to(x.dtype)
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Gemma4Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.num_kv_heads, self.head_dim = cfg.kv_shapes[layer_idx]
        source = cfg.kv_source[layer_idx] if cfg.kv_source is not None else layer_idx
        self.kv_index = cfg.attention_layers.index(source)  # its (or its source's) pool layer
        self.owns_kv = source == layer_idx
        pool = cfg.kv_view()
        self.pool_heads, self.pool_dim = _pool_heads(pool.num_kv_heads * pool.head_dim,
                                                     self.num_heads, self.num_kv_heads,
                                                     self.head_dim)
        self.eps, self.rotary, self.window = cfg.rms_norm_eps, rotary, cfg.layer_window(layer_idx)
        hidden, bias, width = cfg.hidden_size, cfg.attention_bias, self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        if self.owns_kv:
            self.k_proj = nn.Linear(hidden, width, bias=bias)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.v_proj = (None if layer_idx in cfg.gemma4.k_eq_v_layers
                           else nn.Linear(hidden, width, bias=bias))
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, shared: SharedKV) -> torch.Tensor:
        num_tokens = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(num_tokens, self.num_heads, self.head_dim))
        ctx = get_forward_context()
        pool = self._pool_view(ctx.kv_caches[self.kv_index])
        if self.owns_kv:
            k = self.k_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
            v = k if self.v_proj is None else self.v_proj(x).view(k.shape)
            v = _unit_rms(v, self.eps)  # before k's norm: k_eq_v's values are the raw keys
            q, k = self.rotary(positions, q, self.k_norm(k))
            repeat = self.pool_heads // self.num_kv_heads
            if repeat > 1:
                k, v = k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1)
            k, v = self._pad(k), self._pad(v)
            shared[self.kv_index] = (k, v)
        else:
            q = _rotate(self.rotary, positions, q)
            k, v = shared[self.kv_index]
        out = ctx.backend.forward(self._pad(q), k, v, pool, ctx.layer_metadata[self.kv_index],
                                  1.0, self.window, None)
        return self.o_proj(out[..., :self.head_dim].reshape(num_tokens, -1))

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        """Heads zero-padded to the pool's view (zeros add nothing to q.k; the padded value
        dims are cut from the output)."""
        return x if self.pool_dim == self.head_dim else F.pad(x, (0, self.pool_dim - self.head_dim))

    def _pool_view(self, kv: tuple[torch.Tensor, torch.Tensor]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """The pool layer's K and V as heads of this layer's dim (rows are the widest
        layer's: a narrower layer sees more, repeated, heads)."""
        k_pool, v_pool = kv
        if k_pool.shape[-1] == self.pool_dim:
            return k_pool, v_pool
        if k_pool.dtype == torch.int8:
            raise ValueError("an int8 KV cache needs every Gemma 4 layer's heads as wide "
                             "(the rows hold a scale per head); use --kv-cache-dtype auto")
        shape = (*k_pool.shape[:2], self.pool_heads, self.pool_dim)
        return k_pool.view(shape), v_pool.view(shape)


def _pool_heads(width: int, heads: int, kv_heads: int, head_dim: int) -> tuple[int, int]:
    """(heads, dim) a layer views a pool row of ``width`` elements as: its own head dim where
    the row's heads still group its query heads (a multiple of its KV heads dividing the
    query heads), else the dim doubled (zero-padded heads) until they do."""
    dim = head_dim
    while width % dim == 0 and width // dim >= kv_heads:
        n = width // dim
        if n % kv_heads == 0 and heads % n == 0:
            return n, dim
        dim *= 2
    raise ValueError(f"a Gemma 4 layer of {kv_heads} KV heads of {head_dim} cannot view "
                     f"KV rows of {width} (query heads {heads})")



class Rotaries(nn.Module):
    """The sliding layers' and the global layers' rope tables, set, reset and checked together
    (the loader and the engine call these on ``model.rotary``, see layers/rotary.py)."""

    def __init__(self, local: RotaryEmbedding, full: RotaryEmbedding) -> None:
        super().__init__()
        self.local, self.full = local, full

    def reset_tables(self, device: torch.device | None = None) -> None:
        self.local.reset_tables(device)
        self.full.reset_tables(device)

    def set_context_len(self, context_len: int) -> None:
        self.local.set_context_len(context_len)
        self.full.set_context_len(context_len)

    def check_positions(self, positions: torch.Tensor) -> None:
        self.full.check_positions(positions)
