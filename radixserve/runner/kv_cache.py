"""The paged KV pool: preallocated K and V tensors, sized from a memory budget, of the element
type ``--kv-cache-dtype`` resolves to. One pair per layer with one KV group; with several
(sliding-window layers beside full ones, core/kv/kv_groups.py) one pair per pool *slot*,
``unit_layers`` of them, each layer aliasing its slot's pair (the groups' block ids never
overlap, so no two layers write the same rows)."""

from __future__ import annotations

import logging

import torch

from radixserve.config import CacheConfig
from radixserve.core.kv.kv_groups import KVGroups
from radixserve.model_config import ModelConfig


logger = logging.getLogger(__name__)
_KV_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
              "int8": torch.int8}
# int8 pools: each (token, KV head) row holds head_dim int8 values and then its float32 scale
# (paged_attention.cpp), so a row is head_dim + 4 bytes
_INT8_ROW_EXTRA = 4


def row_width(model: ModelConfig, dtype: torch.dtype) -> int:
    """Elements of one (token, KV head) row of a pool of ``dtype``."""
    return model.head_dim + (_INT8_ROW_EXTRA if dtype == torch.int8 else 0)


# the widest head the native paged attention takes (kernels/paged_attention.cpp: kMaxDim)
NATIVE_MAX_HEAD_DIM = 256


def resolve_kv_dtype(name: str, device: torch.device, model_dtype: torch.dtype,
                     head_dim: int = 0) -> torch.dtype:
    """The pool's elements for ``--kv-cache-dtype`` ``name``. ``auto``: float16 for a float32
    model on CPU at every kernel level with F16C (all but generic) — measured there (benchmarks/
    bench_kv_dtype.py, docs/models.md) ~1.9x (avx512) and ~1.4x (avx2) the float32 pool's
    single-stream decode after 4,000 prompt tokens, at KL 4e-7 from it and the same greedy
    tokens, with twice the blocks per GiB — else the model's own dtype (at the generic level
    the widening is scalar and a 16-bit pool measured slower). A model with heads wider than
    the native attention takes (``head_dim``, Gemma 4's 512) runs the torch attention, which
    reads a pool of the model's dtype only."""
    if name != "auto":
        return _KV_DTYPES[name]
    if (device.type == "cpu" and model_dtype == torch.float32
            and head_dim <= NATIVE_MAX_HEAD_DIM):
        from radixserve.kernels import native

        if native.describe().level not in (None, "generic"):
            return torch.float16
    return model_dtype


def torch_for_wide_heads(model: ModelConfig, asked: str) -> str:
    """The backend for a model with heads over ``NATIVE_MAX_HEAD_DIM`` where ``auto`` chose
    cpu_native: ``torch`` (a WARNING, once per runner: the runner asks once), ValueError where
    cpu_native was asked for."""
    if asked == "cpu_native":
        raise ValueError(f"the cpu_native attention takes heads of up to {NATIVE_MAX_HEAD_DIM} "
                         f"dims; {model.architecture} has {model.widest_head_dim}: use the torch "
                         "backend (or auto)")
    kind = "Gemma 4's" if model.gemma4 is not None else f"{model.architecture}'s"
    logger.warning("%s %d-dim global layers run torch attention", kind, model.widest_head_dim)
    return "torch"


def kv_planes(model: ModelConfig) -> int:
    """Tensors per pool layer: K and V, or one for multi-head latent attention, whose cached
    latent row is read as both (models/mla.py)."""
    return 1 if model.mla is not None else 2


def bytes_per_block(model: ModelConfig, block_size: int, dtype: torch.dtype,
                    num_layers: int | None = None) -> int:
    """One block's K and V over ``num_layers`` layers (default: all the model's)."""
    elem = torch.tensor([], dtype=dtype).element_size()
    layers = model.num_layers if num_layers is None else num_layers
    return (kv_planes(model) * layers * block_size * model.num_kv_heads * row_width(model, dtype)
            * elem)


def bytes_per_token(model: ModelConfig, block_size: int, dtype: torch.dtype,
                    draft: ModelConfig | None = None) -> float:
    """One token's K and V over every layer (and the ``draft`` model's, whose pool has as
    many blocks): what the budget's arithmetic (engine/kv_budget.py) counts in."""
    per_block = bytes_per_block(model, block_size, dtype)
    if draft is not None:
        per_block += bytes_per_block(draft, block_size, dtype)
    return per_block / block_size


def num_blocks_for_budget(model: ModelConfig, cache: CacheConfig, dtype: torch.dtype,
                          budget_bytes: int, groups: KVGroups | None = None,
                          draft: ModelConfig | None = None) -> int:
    """How many pool blocks (units of ``groups.unit_layers`` layers) fit in ``budget_bytes``
    (engine/kv_budget.py); ``cache.num_blocks`` if set counts blocks of every layer (the same
    memory whatever the groups). With a ``draft`` model the budget also holds its pool, of
    `draft_pool_blocks` blocks (as many as the target's pool has of every layer)."""
    groups = groups or KVGroups.single(model.num_layers)
    if cache.num_blocks is not None:
        return cache.num_blocks * model.num_layers // groups.unit_layers
    per_block = bytes_per_block(model, cache.block_size, dtype, groups.unit_layers)
    if draft is not None:  # per unit: its share of one draft block
        per_block += (bytes_per_block(draft, cache.block_size, dtype) * groups.unit_layers
                      / model.num_layers)
    num = int(budget_bytes // per_block)
    if num < 1:
        raise ValueError(f"the KV budget ({budget_bytes / 1024**3:.3g} GiB) holds no block "
                         f"({per_block:.0f} bytes each); free memory or raise --kv-cache-memory-gb")
    return num


def draft_pool_blocks(model: ModelConfig, num_blocks: int, groups: KVGroups) -> int:
    """The draft model's pool: as many blocks as the target's ``num_blocks`` units make
    blocks of every layer (one per target block, without the sliding layers' savings)."""
    return max(num_blocks * groups.unit_layers // model.num_layers, 1)


def allocate_kv_cache(model: ModelConfig, num_blocks: int, block_size: int,
                      dtype: torch.dtype, device: torch.device, groups: KVGroups | None = None
                      ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (k, v), each ``[num_blocks, block_size, num_kv_heads, head_dim]`` (int8:
    ``head_dim + 4``, the row's scale after its values); layers of different groups share
    their slot's tensors. All of them are views of one zeroed pool: a layer's tensor alone is
    often under the size `_zeroed` leaves to the kernel's zero pages (1.5B: 56 of 19 MB,
    written through at start-up, 0.3 s), the pool is over it."""
    groups = groups or KVGroups.single(model.num_layers)
    shape = (num_blocks, block_size, model.num_kv_heads, row_width(model, dtype))
    planes = kv_planes(model)  # one: V is K's tensor (an MLA latent)
    pool = _zeroed((groups.unit_layers, planes, *shape), dtype, device)
    slots = [(pool[i, 0], pool[i, planes - 1]) for i in range(groups.unit_layers)]
    return [slots[slot] for _, _, slot in groups.layer_slots()]


_FRESH_BYTES = 64 << 20  # above glibc's largest mmap threshold (32 MiB): always fresh pages


def _zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor. On the CPU a large one is left to the kernel's zero pages (an allocation
    over glibc's mmap threshold is always a fresh mapping), so the pool is not written through
    at start-up (a second per GB) and its memory is resident only as blocks are used."""
    t = torch.empty(shape, dtype=dtype, device=device)
    if device.type != "cpu" or t.nbytes < _FRESH_BYTES:
        t.zero_()
    return t
