"""Reference paged attention in plain torch: runs on any device.

The packed batch holds decode-like sequences (one new token) first, then prefill chunks.
The KV pool per layer is ``[num_blocks, block_size, num_kv_heads, head_dim]``; a token at
position p of a sequence lives in slot ``block_ids[p // block_size] * block_size + p % block_size``.

- decode rows: K/V rows gathered with one ``index_select`` per layer (slot indices and the
  additive length mask are built once per step), then per KV head two batched matmuls over
  strided views (no K/V repeat for grouped queries, no transposed copies). A short chunk with
  earlier context (the tokens a grammar forced, a small tail of a chunked prompt) is
  "decode-like": each of its tokens becomes a decode row whose context ends at that token, so
  it is batched with the decodes and computed exactly as if decoded one token at a time.
- shared prefix (cascade): when the decode rows of two or more sequences start with the same
  KV blocks (a common system prompt, the n samples of one prompt, a shared document), those
  blocks are gathered once and every row's queries attend to them in one matmul per KV head;
  each row's own tail is attended as above, and the two partial softmaxes are merged with
  their log-sum-exp. The result equals the one-pass softmax up to float rounding.
- other prefill chunks, one at a time: a fresh prompt attends causally to its own K/V; a chunk
  with earlier context (chunked prefill, prefix-cache hit) reads the context from the pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F


@dataclass(slots=True)
class PrefillChunk:
    q_start: int
    q_len: int
    start_pos: int
    ctx_slots: torch.Tensor | None  # [ctx_len] pool slots; None when start_pos == 0
    mask: torch.Tensor | None  # [q_len, ctx_len] bool; None when start_pos == 0


MAX_DECODE_CHUNK = 8  # chunks with context up to this long run as decode rows
MIN_SHARED_PREFIX = 64  # shared leading tokens below this are attended per row (no gain)


def is_decode_like(q_len: int, start_pos: int) -> bool:
    """Whether a sequence's new tokens run as decode rows (the packed batch puts these first)."""
    return q_len == 1 or (start_pos > 0 and q_len <= MAX_DECODE_CHUNK)


@dataclass(slots=True)
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor  # [T] where each new token's K/V is written
    num_decodes: int  # decode rows (tokens) at the front of the batch
    decode_slots: torch.Tensor | None  # [B * L] pool slots of each decode row's context
    decode_bias: torch.Tensor | None  # [B, 1, L] 0 where a key is valid, -inf past the end
    shared_slots: torch.Tensor | None  # [P] slots of the leading tokens all decode rows share
    prefills: list[PrefillChunk]


class TorchPagedAttention:
    name = "torch"
    is_decode_like = staticmethod(is_decode_like)

    def build_metadata(self, *, slot_mapping: torch.Tensor, block_table: torch.Tensor,
                       context_lens: list[int], q_lens: list[int], start_pos: list[int],
                       block_size: int, dtype: torch.dtype = torch.float32
                       ) -> TorchAttentionMetadata:
        """``block_table`` [S, max_blocks] padded; decode-like sequences come first."""
        device = slot_mapping.device
        num_seqs = 0
        while num_seqs < len(q_lens) and is_decode_like(q_lens[num_seqs], start_pos[num_seqs]):
            num_seqs += 1
        decode_slots = decode_bias = shared_slots = None
        row_lens = [start_pos[i] + j + 1 for i in range(num_seqs) for j in range(q_lens[i])]
        if num_seqs:
            max_len = max(row_lens)
            slots = _slots(block_table[:num_seqs], block_size, max_len)
            shared = _shared_prefix_len(block_table[:num_seqs], block_size, min(row_lens))
            if shared:
                shared_slots, slots = slots[0, :shared], slots[:, shared:]
            if len(row_lens) > num_seqs:  # a chunk: one row per token, same block table
                slots = slots.repeat_interleave(
                    torch.tensor(q_lens[:num_seqs], device=device), dim=0)
            decode_slots = slots.reshape(-1)
            lens = torch.tensor(row_lens, device=device)
            past_end = torch.arange(shared, max_len, device=device) >= lens[:, None]
            decode_bias = torch.zeros(past_end.shape, dtype=dtype, device=device).masked_fill_(
                past_end, float("-inf")).unsqueeze(1)
        prefills, q_start = [], len(row_lens)
        for i in range(num_seqs, len(q_lens)):
            ctx_slots = mask = None
            if start_pos[i] > 0:
                ctx_len = context_lens[i]
                ctx_slots = _slots(block_table[i:i + 1], block_size, ctx_len)[0]
                q_pos = torch.arange(start_pos[i], ctx_len, device=device)
                mask = torch.arange(ctx_len, device=device)[None, :] <= q_pos[:, None]
            prefills.append(PrefillChunk(q_start, q_lens[i], start_pos[i], ctx_slots, mask))
            q_start += q_lens[i]
        return TorchAttentionMetadata(slot_mapping, len(row_lens), decode_slots, decode_bias,
                                      shared_slots, prefills)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor],
                meta: TorchAttentionMetadata, scale: float) -> torch.Tensor:
        """q [T, H, d], k/v [T, KVH, d] → [T, H, d]. Writes k/v into the pool first."""
        k_cache, v_cache = kv_cache
        num_kv_heads, head_dim = k_cache.shape[-2:]
        flat_k = k_cache.view(-1, num_kv_heads, head_dim)
        flat_v = v_cache.view(-1, num_kv_heads, head_dim)
        flat_k.index_copy_(0, meta.slot_mapping, k)
        flat_v.index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        if meta.num_decodes:
            b = meta.num_decodes
            if meta.shared_slots is None:
                out[:b] = _decode(q[:b], k_cache, v_cache, meta.decode_slots,
                                  meta.decode_bias, scale)
            else:
                out[:b] = _decode_cascade(q[:b], k_cache, v_cache, meta.shared_slots,
                                          meta.decode_slots, meta.decode_bias, scale)
        for p in meta.prefills:
            rows = slice(p.q_start, p.q_start + p.q_len)
            qs = q[rows].transpose(0, 1).unsqueeze(0)
            if p.ctx_slots is None:
                ks, vs = k[rows], v[rows]
                o = F.scaled_dot_product_attention(
                    qs, ks.transpose(0, 1).unsqueeze(0), vs.transpose(0, 1).unsqueeze(0),
                    is_causal=True, scale=scale, enable_gqa=True)
            else:
                ks, vs = flat_k[p.ctx_slots], flat_v[p.ctx_slots]
                o = F.scaled_dot_product_attention(
                    qs, ks.transpose(0, 1).unsqueeze(0), vs.transpose(0, 1).unsqueeze(0),
                    attn_mask=p.mask, scale=scale, enable_gqa=True)
            out[rows] = o.squeeze(0).transpose(0, 1)
        return out


def _slots(block_table: torch.Tensor, block_size: int, length: int) -> torch.Tensor:
    """[S, max_blocks] block ids → [S, length] pool slots of positions 0..length-1."""
    offsets = torch.arange(block_size, device=block_table.device)
    slots = (block_table[:, :, None] * block_size + offsets).flatten(1)
    return slots[:, :length]


def _shared_prefix_len(block_table: torch.Tensor, block_size: int, min_len: int) -> int:
    """Tokens in the leading blocks that all rows of ``block_table`` [S, max_blocks] have in
    common, below ``min_len`` (every row keeps a tail of its own); 0 when one sequence or too
    few to pay for the merge."""
    if block_table.shape[0] < 2:
        return 0
    same = (block_table == block_table[:1]).all(0)
    common = int(same.int().cumprod(0).sum())
    shared = min(common * block_size, (min_len - 1) // block_size * block_size)
    return shared if shared >= MIN_SHARED_PREFIX else 0


def _decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            slots: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B, H, d]; slots [B * L]; bias [B, 1, L] → [B, H, d]."""
    b, num_heads, d = q.shape
    num_kv_heads = k_cache.shape[2]
    rows = k_cache.shape[0] * k_cache.shape[1]
    k = k_cache.view(rows, -1).index_select(0, slots).view(b, -1, num_kv_heads, d)
    v = v_cache.view(rows, -1).index_select(0, slots).view(b, -1, num_kv_heads, d)
    qg = q.view(b, num_kv_heads, num_heads // num_kv_heads, d)
    out = torch.empty_like(qg)
    for h in range(num_kv_heads):  # k[:, :, h] is a strided [B, L, d] view: BLAS reads it as is
        scores = torch.baddbmm(bias, qg[:, h], k[:, :, h].transpose(1, 2), alpha=scale)
        out[:, h] = torch.bmm(torch.softmax(scores, dim=-1), v[:, :, h])
    return out.view(b, num_heads, d)


def _decode_cascade(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    shared_slots: torch.Tensor, slots: torch.Tensor, bias: torch.Tensor,
                    scale: float) -> torch.Tensor:
    """Decode attention over a prefix every row shares plus each row's tail.

    q [B, H, d]; shared_slots [P]; slots [B * L] (the tails); bias [B, 1, L] → [B, H, d].
    The shared K/V is gathered once and met by all B * H / KVH queries of a head in one matmul;
    the partial softmaxes (max m, sum l, unnormalised output o) are then merged.
    """
    b, num_heads, d = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    rows = k_cache.shape[0] * k_cache.shape[1]
    pk = k_cache.view(rows, -1).index_select(0, shared_slots).view(-1, num_kv_heads, d)
    pv = v_cache.view(rows, -1).index_select(0, shared_slots).view(-1, num_kv_heads, d)
    k = k_cache.view(rows, -1).index_select(0, slots).view(b, -1, num_kv_heads, d)
    v = v_cache.view(rows, -1).index_select(0, slots).view(b, -1, num_kv_heads, d)
    qg = q.view(b, num_kv_heads, group, d)
    out = torch.empty_like(qg)
    for h in range(num_kv_heads):
        qh = qg[:, h]  # [B, G, d]
        s1 = torch.matmul(qh.reshape(b * group, d), pk[:, h].t()).mul_(scale)  # [B*G, P]
        m1 = s1.amax(-1, keepdim=True)
        e1 = torch.exp_(s1.sub_(m1))
        l1 = e1.sum(-1, keepdim=True)
        o1 = torch.matmul(e1, pv[:, h])  # [B*G, d]
        s2 = torch.baddbmm(bias, qh, k[:, :, h].transpose(1, 2), alpha=scale)  # [B, G, L]
        m2 = s2.amax(-1, keepdim=True)
        e2 = torch.exp_(s2.sub_(m2))
        l2 = e2.sum(-1, keepdim=True)
        o2 = torch.bmm(e2, v[:, :, h]).view(b * group, d)
        m2, l2 = m2.view(b * group, 1), l2.view(b * group, 1)
        m = torch.maximum(m1, m2)
        a1, a2 = torch.exp(m1 - m), torch.exp(m2 - m)
        merged = (o1 * a1 + o2 * a2) / (l1 * a1 + l2 * a2)
        out[:, h] = merged.view(b, group, d)
    return out.view(b, num_heads, d)
