"""Reference paged attention in plain torch: runs on any device.

The packed batch holds decode-like sequences (one new token) first, then prefill chunks.
The KV pool per layer is ``[num_blocks, block_size, num_kv_heads, head_dim]``; a token at
position p of a sequence lives in slot ``block_ids[p // block_size] * block_size + p % block_size``.

- decode rows: K/V gathered whole blocks at a time with one ``index_select`` per layer
  (block indices and the additive length mask are built once per step), then per KV head two
  batched matmuls over strided views (no K/V repeat for grouped queries, no transposed copies). A short chunk with
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
- a sliding-window layer (``window``: the query at p attends to keys p - window < j <= p, as
  transformers' mask) or one with soft-capped scores (``softcap``: cap * tanh(s / cap), Gemma 2)
  masks the same gathered context: decode rows over their whole block list (no cascade), chunks
  with the window ANDed into their causal mask, scores capped before the mask is added.
- attention sinks (``sinks`` [H], gpt-oss): each head's learned logit joins its softmax as one
  more column with no value (p_j = exp(s_j) / (sum_i exp(s_i) + exp(sink))); rows take the same
  masked paths as a window (``_softmax_with_sinks``).
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
    ctx_blocks: torch.Tensor | None  # pool blocks of the context; None when start_pos == 0
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
    decode_blocks: torch.Tensor | None  # [B * nb] pool blocks of each decode row's context
    decode_bias: torch.Tensor | None  # [B, 1, nb * bs] 0 where a key is valid, else -inf
    shared_blocks: torch.Tensor | None  # [P / bs] leading blocks all decode rows share
    block_size: int  # tokens per block as the scheduler addresses the pool
    prefills: list[PrefillChunk]
    decode_table: torch.Tensor | None = None  # [B, nb] each decode row's blocks, shared ones too
    decode_lens: torch.Tensor | None = None  # [B] each decode row's context length
    # [T] where each row's keys end (exclusive) where some row's pass its position + 1 (an
    # image's rows that see all of it: `see_whole_images`); None: causal rows
    row_limit: torch.Tensor | None = None

    def see_whole_images(self, rows: torch.Tensor, limit: torch.Tensor) -> None:
        """Packed ``rows`` attend up to ``limit`` (exclusive) instead of their own position
        (a window still counts back from each row's position); a new tensor, so a shallow
        copy of this metadata keeps the causal rows."""
        if self.row_limit is None:
            ends = [torch.arange(p.start_pos + 1, p.start_pos + p.q_len + 1)
                    for p in self.prefills]
            if self.num_decodes:
                ends.insert(0, self.decode_lens.cpu())
            self.row_limit = torch.cat(ends).to(self.slot_mapping.device)
        row_limit = self.row_limit.clone()
        row_limit[rows] = limit
        self.row_limit = row_limit


class TorchPagedAttention:
    name = "torch"
    is_decode_like = staticmethod(is_decode_like)

    def build_metadata(self, *, slot_mapping: torch.Tensor, block_table: torch.Tensor,
                       context_lens: list[int], q_lens: list[int], start_pos: list[int],
                       block_size: int, dtype: torch.dtype = torch.float32
                       ) -> TorchAttentionMetadata:
        """``block_table`` [S, max_blocks] padded; decode-like sequences come first."""
        device = slot_mapping.device
        num_seqs = num_decode_seqs(q_lens, start_pos)
        decode_blocks = decode_bias = shared_blocks = decode_table = lens = None
        row_lens = decode_row_lens(q_lens, start_pos, num_seqs)
        if num_seqs:
            num_blocks = -(-max(row_lens) // block_size)
            blocks = block_table[:num_seqs, :num_blocks]
            decode_table = blocks
            if len(row_lens) > num_seqs:
                decode_table = blocks.repeat_interleave(
                    torch.tensor(q_lens[:num_seqs], device=device), dim=0)
            shared = _shared_prefix_len(blocks, block_size, min(row_lens))
            if shared:
                n = shared // block_size
                shared_blocks, blocks = blocks[0, :n], blocks[:, n:]
            if len(row_lens) > num_seqs:  # a chunk: one row per token, same block table
                blocks = blocks.repeat_interleave(
                    torch.tensor(q_lens[:num_seqs], device=device), dim=0)
            decode_blocks = blocks.reshape(-1)
            lens = torch.tensor(row_lens, device=device)
            past_end = (torch.arange(shared, num_blocks * block_size, device=device)
                        >= lens[:, None])
            decode_bias = torch.zeros(past_end.shape, dtype=dtype, device=device).masked_fill_(
                past_end, float("-inf")).unsqueeze(1)
        prefills = prefill_chunks(block_table, context_lens, q_lens, start_pos, block_size,
                                  num_seqs)
        return TorchAttentionMetadata(slot_mapping, len(row_lens), decode_blocks, decode_bias,
                                      shared_blocks, block_size, prefills, decode_table, lens)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor],
                meta: TorchAttentionMetadata, scale: float, window: int | None = None,
                softcap: float | None = None, sinks: torch.Tensor | None = None
                ) -> torch.Tensor:
        """q [T, H, d], k/v [T, KVH, d] → [T, H, d]. Writes k/v into the pool first.
        ``window``: keys p - window < j <= p only; ``softcap``: capped scores; ``sinks``:
        each head's sink logit (see above)."""
        flat_k, flat_v = write_kv(k, v, kv_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        if meta.num_decodes:
            b = meta.num_decodes
            if (window is not None or softcap is not None or sinks is not None
                    or meta.row_limit is not None):
                blocks, bias = windowed_decode_inputs(meta, window, q.dtype)
                out[:b] = _decode(q[:b], flat_k, flat_v, meta.block_size, blocks, bias, scale,
                                  softcap, sinks)
            elif meta.shared_blocks is None:
                out[:b] = _decode(q[:b], flat_k, flat_v, meta.block_size, meta.decode_blocks,
                                  meta.decode_bias, scale)
            else:
                out[:b] = _decode_cascade(q[:b], flat_k, flat_v, meta.block_size,
                                          meta.shared_blocks, meta.decode_blocks,
                                          meta.decode_bias, scale)
        attend_prefills(q, k, v, flat_k, flat_v, meta.prefills, meta.block_size, scale, out,
                        window, softcap, sinks, meta.row_limit)
        return out


def windowed_decode_inputs(meta: TorchAttentionMetadata, window: int | None,
                           dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode rows' whole block lists [B * nb] and their bias [B, 1, nb * bs]: 0 for the
    keys a row attends to (within ``window`` of its position, if any), else -inf."""
    table, lens = meta.decode_table, meta.decode_lens
    keys = torch.arange(table.shape[1] * meta.block_size, device=table.device)
    ends = lens if meta.row_limit is None else meta.row_limit[:lens.shape[0]]
    invalid = keys >= ends[:, None]
    if window is not None:
        invalid |= keys < (lens - window)[:, None]
    bias = torch.zeros(invalid.shape, dtype=dtype, device=table.device).masked_fill_(
        invalid, float("-inf")).unsqueeze(1)
    return table.reshape(-1), bias


def num_decode_seqs(q_lens: list[int], start_pos: list[int]) -> int:
    """How many leading sequences run as decode rows."""
    num_seqs = 0
    while num_seqs < len(q_lens) and is_decode_like(q_lens[num_seqs], start_pos[num_seqs]):
        num_seqs += 1
    return num_seqs


def decode_row_lens(q_lens: list[int], start_pos: list[int], num_seqs: int) -> list[int]:
    """Each decode row's context length (a chunk gives one row per token)."""
    return [start_pos[i] + j + 1 for i in range(num_seqs) for j in range(q_lens[i])]


def prefill_chunks(block_table: torch.Tensor, context_lens: list[int], q_lens: list[int],
                   start_pos: list[int], block_size: int, num_seqs: int) -> list[PrefillChunk]:
    """The sequences after the first ``num_seqs`` (decode-like) ones, as prefill chunks."""
    device = block_table.device
    prefills = []
    q_start = sum(q_lens[:num_seqs])
    for i in range(num_seqs, len(q_lens)):
        ctx_blocks = mask = None
        if start_pos[i] > 0:
            ctx_len = context_lens[i]
            ctx_blocks = block_table[i, :-(-ctx_len // block_size)]
            q_pos = torch.arange(start_pos[i], ctx_len, device=device)
            mask = torch.arange(ctx_len, device=device)[None, :] <= q_pos[:, None]
        prefills.append(PrefillChunk(q_start, q_lens[i], start_pos[i], ctx_blocks, mask))
        q_start += q_lens[i]
    return prefills


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor],
             slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Store the new tokens' K/V at their slots; returns the pools viewed as [slots, KVH, d]."""
    k_cache, v_cache = kv_cache
    num_kv_heads, head_dim = k_cache.shape[-2:]
    flat_k = k_cache.view(-1, num_kv_heads, head_dim)
    flat_v = v_cache.view(-1, num_kv_heads, head_dim)
    flat_k.index_copy_(0, slot_mapping, k)
    flat_v.index_copy_(0, slot_mapping, v)
    return flat_k, flat_v


def attend_prefills(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, flat_k: torch.Tensor,
                    flat_v: torch.Tensor, prefills: list[PrefillChunk], block_size: int,
                    scale: float, out: torch.Tensor, window: int | None = None,
                    softcap: float | None = None, sinks: torch.Tensor | None = None,
                    row_limit: torch.Tensor | None = None) -> None:
    """Prefill chunks, one at a time, into their rows of ``out`` (``row_limit``: see
    `TorchAttentionMetadata`)."""
    num_kv_heads, head_dim = flat_k.shape[1:]
    for p in prefills:
        rows = slice(p.q_start, p.q_start + p.q_len)
        qs = q[rows].transpose(0, 1).unsqueeze(0)
        if p.ctx_blocks is None:
            ks, vs, mask = k[rows], v[rows], None
        else:
            ctx_len = p.mask.shape[1]
            ks, vs = _gather_blocks(flat_k, flat_v, block_size, p.ctx_blocks)
            ks = ks.view(-1, num_kv_heads, head_dim)[:ctx_len]
            vs = vs.view(-1, num_kv_heads, head_dim)[:ctx_len]
            mask = p.mask
        ks, vs = ks.transpose(0, 1).unsqueeze(0), vs.transpose(0, 1).unsqueeze(0)
        if row_limit is not None:
            ends = row_limit[rows]
            o = _masked_attention(qs, ks, vs, _chunk_mask(p, ks.shape[2], window, q.device, ends),
                                  scale, softcap, sinks)
        elif window is None and softcap is None and sinks is None:
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, is_causal=mask is None,
                                               scale=scale, enable_gqa=True)
        else:
            o = _masked_attention(qs, ks, vs, _chunk_mask(p, ks.shape[2], window, q.device),
                                  scale, softcap, sinks)
        out[rows] = o.squeeze(0).transpose(0, 1)


def _chunk_mask(p: PrefillChunk, ctx_len: int, window: int | None,
                device: torch.device, ends: torch.Tensor | None = None) -> torch.Tensor:
    """[q_len, ctx_len] bool: query i (at position start_pos + i) sees key j where
    pos - window < j <= pos (no lower bound without a window), or j < ends[i] where given."""
    q_pos = torch.arange(p.start_pos, p.start_pos + p.q_len, device=device)[:, None]
    keys = torch.arange(ctx_len, device=device)[None, :]
    mask = keys <= q_pos if ends is None else keys < ends[:, None]
    if window is not None:
        mask &= keys > q_pos - window
    return mask


def _masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      scale: float, softcap: float | None,
                      sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [1, H, L, d], k/v [1, KVH, S, d], mask [L, S] bool → [1, H, L, d], with the scores
    soft-capped (cap * tanh(s / cap)) before masking when ``softcap`` is set; ``sinks`` [H]
    in each head's denominator."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(_softmax_with_sinks(scores, sinks, 1), v)


def _softmax_with_sinks(scores: torch.Tensor, sinks: torch.Tensor | None,
                        head_dim: int) -> torch.Tensor:
    """Softmax over the last dimension of ``scores``, whose dimension ``head_dim`` holds the
    heads of ``sinks`` (None: a plain softmax): each head's sink logit as one more column,
    dropped after the softmax."""
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    shape = [1] * scores.dim()
    shape[head_dim] = -1
    sink = sinks.to(scores.dtype).view(shape).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]


def _gather_blocks(flat_k: torch.Tensor, flat_v: torch.Tensor, block_size: int,
                   blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V of ``blocks`` (pools viewed as ``[slots, KVH, d]``), one contiguous copy
    each: whole blocks, fewer and larger copies than token by token."""
    width = block_size * flat_k.shape[1] * flat_k.shape[2]
    return (flat_k.view(-1, width).index_select(0, blocks),
            flat_v.view(-1, width).index_select(0, blocks))


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


def _decode(q: torch.Tensor, flat_k: torch.Tensor, flat_v: torch.Tensor, block_size: int,
            blocks: torch.Tensor, bias: torch.Tensor, scale: float,
            softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, H, d]; pools [slots, KVH, d]; blocks [B * nb]; bias [B, 1, nb * block_size]
    → [B, H, d]; ``softcap``: scores capped before the bias is added; ``sinks`` [H]."""
    b, num_heads, d = q.shape
    num_kv_heads = flat_k.shape[1]
    k, v = _gather_blocks(flat_k, flat_v, block_size, blocks)
    k, v = k.view(b, -1, num_kv_heads, d), v.view(b, -1, num_kv_heads, d)
    group = num_heads // num_kv_heads
    qg = q.view(b, num_kv_heads, group, d)
    out = torch.empty_like(qg)
    for h in range(num_kv_heads):  # k[:, :, h] is a strided [B, L, d] view: BLAS reads it as is
        if softcap is None:
            scores = torch.baddbmm(bias, qg[:, h], k[:, :, h].transpose(1, 2), alpha=scale)
        else:
            scores = torch.bmm(qg[:, h], k[:, :, h].transpose(1, 2)) * scale
            scores = torch.tanh(scores / softcap) * softcap + bias
        head_sinks = None if sinks is None else sinks[h * group:(h + 1) * group]
        out[:, h] = torch.bmm(_softmax_with_sinks(scores, head_sinks, 1), v[:, :, h])
    return out.view(b, num_heads, d)


def _decode_cascade(q: torch.Tensor, flat_k: torch.Tensor, flat_v: torch.Tensor,
                    block_size: int, shared_blocks: torch.Tensor, blocks: torch.Tensor,
                    bias: torch.Tensor, scale: float) -> torch.Tensor:
    """Decode attention over a prefix every row shares plus each row's tail.

    q [B, H, d]; shared_blocks [P / bs]; blocks [B * nb] (the tails); bias [B, 1, nb * bs]
    → [B, H, d].
    The shared K/V is gathered once and met by all B * H / KVH queries of a head in one matmul;
    the partial softmaxes (max m, sum l, unnormalised output o) are then merged.
    """
    b, num_heads, d = q.shape
    num_kv_heads = flat_k.shape[1]
    group = num_heads // num_kv_heads
    pk, pv = _gather_blocks(flat_k, flat_v, block_size, shared_blocks)
    pk, pv = pk.view(-1, num_kv_heads, d), pv.view(-1, num_kv_heads, d)
    k, v = _gather_blocks(flat_k, flat_v, block_size, blocks)
    k, v = k.view(b, -1, num_kv_heads, d), v.view(b, -1, num_kv_heads, d)
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
