"""Paged attention on CPU with the native kernel (``radixserve/kernels/paged_attention.cpp``).

Every query row of the step — decode tokens, short chunks, whole prompts — reads its context
from the pool in place (no gathered copy per layer, no mask tensors), in one call per layer.
Each (row, KV head) is computed on its own with a fixed order of operations, so a row's result
is bit-identical whether it was decoded alone or in any batch, prefilled in one chunk or
several, or found most of its context in the prefix cache. Needs a CPU pool of float32,
float16 or bfloat16 (``--kv-cache-dtype``; rows rounded once when stored, read back exactly),
or int8 (one scale per token and head, ``runner/kv_cache.py``);
``resolve_attn_backend("auto")`` picks this backend there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from radixserve.kernels import native, ops
from radixserve.layers.attn_backends.torch_paged import is_decode_like


@dataclass(slots=True)
class NativeAttentionMetadata:
    slot_mapping: torch.Tensor  # [T] where each new token's K/V is written
    block_table: torch.Tensor  # [S, max_blocks] int64 pool blocks of each sequence
    row_seq: torch.Tensor  # [T] int64 the sequence of each query row
    row_len: torch.Tensor  # [T] int64 tokens each row attends to (its position + 1)
    block_size: int
    # [T] int64 each row's position, set where a row's limit goes past it (Gemma 3's image
    # rows see their whole image: runner/image_embeds.py); None: row_len - 1
    row_pos: torch.Tensor | None = None

    def see_whole_images(self, rows: torch.Tensor, limit: torch.Tensor) -> None:
        """Packed ``rows`` attend up to ``limit`` (exclusive) instead of their own position:
        an image's rows see all of it (a window still counts back from each row's position).
        New tensors: a shallow copy of this metadata keeps the old limits."""
        self.row_pos = self.row_len - 1 if self.row_pos is None else self.row_pos
        row_len = self.row_len.clone()
        row_len[rows] = limit
        self.row_len = row_len


class NativeCpuPagedAttention:
    name = "cpu_native"
    is_decode_like = staticmethod(is_decode_like)

    def __init__(self) -> None:
        if native.load() is None:
            raise ValueError("the cpu_native attention backend needs the native CPU kernels, "
                             "which are unavailable here (see radixserve.kernels' log)")

    def build_metadata(self, *, slot_mapping: torch.Tensor, block_table: torch.Tensor,
                       context_lens: list[int], q_lens: list[int], start_pos: list[int],
                       block_size: int, dtype: torch.dtype = torch.float32
                       ) -> NativeAttentionMetadata:
        """``block_table`` [S, max_blocks] padded; sequence i's ``q_lens[i]`` new tokens sit
        at positions ``start_pos[i]`` onwards."""
        lens = np.asarray(q_lens, dtype=np.int64)
        row_seq = np.repeat(np.arange(len(q_lens)), lens)
        first_row = np.cumsum(lens) - lens
        offset = np.arange(row_seq.size) - first_row[row_seq]
        row_len = np.asarray(start_pos, dtype=np.int64)[row_seq] + offset + 1
        return NativeAttentionMetadata(slot_mapping.to(torch.int64).contiguous(),
                                       block_table.to(torch.int64).contiguous(),
                                       torch.from_numpy(row_seq), torch.from_numpy(row_len),
                                       block_size)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor],
                meta: NativeAttentionMetadata, scale: float, window: int | None = None,
                softcap: float | None = None, sinks: torch.Tensor | None = None
                ) -> torch.Tensor:
        """q [T, H, d], k/v [T, KVH, d] (rows may be strided, heads contiguous) → [T, H, d].
        The kernel writes k/v into the pool first. ``window``: a row at position p attends to
        keys p - window < j <= p only (a sliding-window layer); ``softcap``: scores capped to
        softcap * tanh(score / softcap) (Gemma 2); ``sinks`` [H] float32: each head's sink
        logit, in its softmax's denominator only (gpt-oss)."""
        k_cache, v_cache = kv_cache
        return ops.paged_attention(_rows(q), _rows(k), _rows(v), k_cache, v_cache, meta, scale,
                                   window, softcap, sinks)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` [T, heads, d] with each row's heads contiguous (a row stride of its own is fine)."""
    if x.stride(2) == 1 and x.stride(1) == x.shape[2]:
        return x
    return x.contiguous()
