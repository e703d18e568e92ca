"""The paged KV pool: one preallocated K and V tensor per layer, sized from a memory budget."""

from __future__ import annotations

import torch

from radixserve.config import CacheConfig, ModelConfig


def num_blocks_for_budget(model: ModelConfig, cache: CacheConfig, dtype: torch.dtype) -> int:
    """How many blocks fit in ``cache.kv_cache_memory_gb`` (or ``cache.num_blocks`` if set)."""
    if cache.num_blocks is not None:
        return cache.num_blocks
    elem = torch.tensor([], dtype=dtype).element_size()
    per_block = 2 * model.num_layers * cache.block_size * model.kv_size * elem
    num = int(cache.kv_cache_memory_gb * 1024**3 // per_block)
    if num < 1:
        raise ValueError(f"kv_cache_memory_gb={cache.kv_cache_memory_gb} holds no block "
                         f"({per_block} bytes each)")
    return num


def allocate_kv_cache(model: ModelConfig, num_blocks: int, block_size: int,
                      dtype: torch.dtype, device: torch.device
                      ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (k, v), each ``[num_blocks, block_size, num_kv_heads, head_dim]``."""
    shape = (num_blocks, block_size, model.num_kv_heads, model.head_dim)
    return [(torch.zeros(shape, dtype=dtype, device=device),
             torch.zeros(shape, dtype=dtype, device=device)) for _ in range(model.num_layers)]
