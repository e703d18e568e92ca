"""Latent paged attention: every query head of a multi-head latent attention layer (models/
mla.py) against ONE shared KV head, each token's cached row ``[c_kv | k_rope]``, whose first
``kv_lora_rank`` dims are also its value.

The pool layer (runner/kv_cache.py with ``ModelConfig.mla``) is one tensor
``[num_blocks, block_size, 1, kv_lora_rank + rope]`` read as both K and V: per token and layer
``kv_lora_rank + rope`` elements, where per-head K and V would take ``heads * (nope + rope +
v)``. Neither backend's kernel serves it as it is (the native one takes head dims up to 256,
the latent row is 576 wide for GLM-4.7-Flash and DeepSeek-V3, so the runner picks the torch
backend for such a model, runner/kv_cache.py ``torch_for_wide_heads``; the torch one reads a V
of its own), so these layers attend here, in torch: the step metadata of either backend
(``TorchAttentionMetadata`` or ``NativeAttentionMetadata``) is read as a list of sequences, each
row range with its first position and block list::

    packed rows  [ seq 0 rows | seq 1 rows | ... ]     (decode-like sequences first)
    seq s        q rows [q_start, q_start + q_len), positions start_pos .. start_pos + q_len - 1
                 context keys 0 .. start_pos + q_len - 1, read from its blocks

Each sequence is computed alone (scores, float32 softmax, weighted latent sum), its rows
together, causally masked. Where ``exact`` (a quantized model on the CPU, whose native linears
give each row its own bits) each query row goes alone, against exactly its causal context, so
its products have one shape whatever its chunk or batch: a row's bits do not depend on how its
prompt was chunked or what else ran in its step, as the native backend promises (a CPU
sgemm's bits change with its shape). The pool may hold float32,
float16 or bfloat16 (rows rounded once when stored, read back widened); int8 pools are refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class LatentSeq:
    """One sequence of the step: its query rows, first new position and pool blocks (None:
    a fresh prompt whose keys are its own new rows)."""

    q_start: int
    q_len: int
    start_pos: int
    blocks: torch.Tensor | None


def step_sequences(meta) -> list[LatentSeq]:
    """The step's sequences from either backend's metadata (module docstring)."""
    if hasattr(meta, "row_seq"):  # NativeAttentionMetadata: a row per token, its sequence
        counts = torch.bincount(meta.row_seq, minlength=meta.block_table.shape[0]).tolist()
        seqs, start = [], 0
        row_len = meta.row_len.tolist()
        for s, n in enumerate(counts):
            if n:
                seqs.append(LatentSeq(start, n, row_len[start] - 1, meta.block_table[s]))
            start += n
        return seqs
    seqs = []
    if meta.num_decodes:  # decode rows: each one a context of its own
        lens = meta.decode_lens.tolist()
        seqs = [LatentSeq(r, 1, lens[r] - 1, meta.decode_table[r]) for r in range(len(lens))]
    seqs += [LatentSeq(p.q_start, p.q_len, p.start_pos, p.ctx_blocks) for p in meta.prefills]
    return seqs


def latent_attention(q: torch.Tensor, latent: torch.Tensor, pool: torch.Tensor, meta,
                     scale: float, value_dim: int, exact: bool = False) -> torch.Tensor:
    """q [T, H, D] (``[q_latent | q_rope]``), latent [T, D] (``[c_kv | k_rope]``, the new
    tokens' rows, written into ``pool`` at ``meta.slot_mapping`` first) → [T, H, value_dim]:
    each head's softmax over its context's rows times their first ``value_dim`` dims.
    ``exact``: each query row alone (module docstring). Mutates ``pool``."""
    if pool.dtype == torch.int8:
        raise ValueError("an int8 KV cache is not supported for multi-head latent attention; "
                         "use --kv-cache-dtype float32, float16 or bfloat16")
    flat = pool.view(-1, pool.shape[-1])
    flat.index_copy_(0, meta.slot_mapping, latent.to(pool.dtype))
    by_block = pool.view(pool.shape[0], -1)
    out = q.new_empty(q.shape[0], q.shape[1], value_dim)
    for s in step_sequences(meta):
        rows = slice(s.q_start, s.q_start + s.q_len)
        ctx_len = s.start_pos + s.q_len
        if s.blocks is None:
            keys = latent[rows]
        else:
            num_blocks = -(-ctx_len // pool.shape[1])
            keys = by_block.index_select(0, s.blocks[:num_blocks]).view(-1, latent.shape[1])
            keys = keys[:ctx_len].to(q.dtype)
        if exact:  # each row alone: its bits whatever its chunk or batch
            for i in range(s.q_len):
                out[s.q_start + i] = _attend(q[s.q_start + i:s.q_start + i + 1],
                                             keys[:s.start_pos + i + 1], s.start_pos + i,
                                             scale, value_dim)[0]
        else:
            out[rows] = _attend(q[rows], keys, s.start_pos, scale, value_dim)
    return out


def _attend(q: torch.Tensor, keys: torch.Tensor, start_pos: int, scale: float,
            value_dim: int) -> torch.Tensor:
    """q [n, H, D] at positions start_pos.., keys [L, D] (positions 0..L-1) → [n, H, value_dim],
    causal."""
    n, ctx_len = q.shape[0], keys.shape[0]
    scores = torch.matmul(q, keys.t()).float() * scale  # [n, H, L]
    if n > 1:
        q_pos = torch.arange(start_pos, start_pos + n, device=q.device)
        future = torch.arange(ctx_len, device=q.device)[None, :] > q_pos[:, None]
        scores = scores.masked_fill(future[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    return torch.matmul(probs, keys[:, :value_dim])
