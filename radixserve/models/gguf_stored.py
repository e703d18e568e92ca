"""A GGUF model loaded as stored (``--quantization gguf``, what ``auto`` picks for quantized
GGUF files on CPU): every quantized matrix becomes a `BlockLinear` on the file's own blocks,
the token embedding keeps its stored rows on the file's mapping and dequantizes the ones a
step looks up (a head tied to it holds the only copy: the embedding reads the head's packed
rows, layers/block_rows.py),
and only the small float tensors (norms, biases) become float32.

No float copy of a matrix exists at any point: the model is built on the meta device, each
matrix goes from the file's memory map through its codes (1 byte a weight, one matrix at a
time) into the kernel's packed layout (about the file's bytes), and the mapped pages it was
read from are handed back to the kernel (``MADV_DONTNEED``), so the load peaks near the file
size plus the largest matrix's codes. Matrices stored as F16 / BF16 become 16-bit parts of the
same layer kind (their values as stored, float32 activations; ``kernels/half_linear.cpp``), so
an all-F16 or all-BF16 file loads as stored too. F32 / F64 matrices (rare in layer matrices:
llama.cpp writes them for tiny tensors only) run in int8, logged once: a float32 kernel would
hold 4 bytes a weight for no gain over the float model.
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from torch import nn
from tqdm import tqdm

from radixserve.cpu.memory import trim_heap
from radixserve.model_config import ModelConfig
from radixserve.models.tp_shard import TensorShard
from radixserve.layers.block_linear import REPACK, FORMATS, BlockLinear, Repack, packed_bytes
from radixserve.layers.block_rows import PackedEmbedding
from radixserve.layers.int8_linear import Int8Linear
from radixserve.layers.gguf_quant import dequantize, to_torch
from radixserve.models.moe import expand_experts

logger = logging.getLogger(__name__)


class StoredEmbedding(nn.Module):
    """Token embedding on the file's rows: ``ids`` [T] → [T, dim] float32, each looked-up row
    dequantized exactly as ``gguf_quant.dequantize`` gives it. ``raw`` is a view of the file's
    read-only mapping, as llama.cpp keeps its tables: only the pages of rows looked up are
    read in (a 152k-row table is 125 MB at Q4_K, of which a conversation touches a few MB),
    and they are the page cache's, shared with any other process reading the file."""

    def __init__(self, raw: torch.Tensor, qtype: GGMLQuantizationType, dim: int) -> None:
        super().__init__()
        self.register_buffer("rows", raw)  # uint8 [vocab, bytes per row]
        self.qtype, self.embedding_dim = GGMLQuantizationType(qtype), dim

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        picked = self.rows[ids.reshape(-1)]
        return dequantize(picked, self.qtype, (picked.shape[0], self.embedding_dim))

    @property
    def weight(self) -> torch.Tensor:
        """The whole table in float32 (tests and the torch paths only: a full copy)."""
        return dequantize(self.rows, self.qtype, (self.rows.shape[0], self.embedding_dim))

    def extra_repr(self) -> str:
        return f"{self.rows.shape[0]}, {self.embedding_dim}, stored {self.qtype.name}"


def load_stored(model: nn.Module, reader, config: ModelConfig, device: torch.device,
                hf_name, unpermute_rows, show_progress: bool = True,
                shard: TensorShard = TensorShard(), layout=None,
                packs: Repack = REPACK) -> nn.Module:
    """Fill ``model`` (built on the meta device) from the GGUF ``reader`` as stored.
    ``hf_name``: GGUF tensor name → HF name (None to skip); ``unpermute_rows(n, heads)``: the
    row order that undoes llama.cpp's Q/K permutation, or None for architectures without it;
    ``shard``: the tensor-parallel rank's rows and columns of each matrix (``config`` is the
    whole model's shape); ``layout``: where the converter reordered or changed tensors beyond
    that (models/qwen35_gguf.py's ``Qwen35Gguf``: a matrix's ``row_order``, a layer's
    ``wrap`` for input columns in the file's order, the float tensors' ``to_hf``), or None;
    ``packs``: where each layer's packed bytes come from (models/packed_cache.py), keyed by
    its HF name.
    ValueError for a missing tensor or one of an unsupported type."""
    tensors = {}
    for t in reader.tensors:  # a 3-D expert tensor as one view per expert
        tensors.update(expand_experts(hf_name(t.name), t))
    pages = _Pages(reader)
    packed = getattr(model, "packed_modules", {})
    linears = [(prefix, parent, name) for prefix, parent in model.named_modules()
               for name, child in parent.named_children() if isinstance(child, nn.Linear)]
    requantized: list[str] = []
    bar = tqdm(linears, desc="packing GGUF blocks", unit="matrix", disable=not show_progress,
               leave=False, delay=1.0)
    for prefix, parent, name in bar:
        base = f"{prefix}.{name}" if prefix else name
        shards = ([base] if f"{base}.weight" in tensors  # stored fused (Phi-3's attn_qkv)
                  else [base.rsplit(name, 1)[0] + shard for shard in packed.get(name, (name,))])
        weights = [_take(tensors, f"{s}.weight") for s in shards]
        bias = getattr(parent, name).bias
        biases = [_take(tensors, f"{s}.bias") for s in shards] if bias is not None else []
        heads = [_heads(config, s) for s in shards]
        layer = _linear(weights, biases, heads, unpermute_rows, requantized, pages, shard, shards,
                        layout, packs, base)
        setattr(parent, name, layout.wrap(base, layer) if layout else layer)
    embed = tensors.pop("embed_tokens.weight", None)
    if embed is None:
        raise ValueError("weights missing from the checkpoint: ['embed_tokens.weight']")
    tied = getattr(model, "lm_head", False) is None
    if tied:  # the head multiplies the stored table
        model.lm_head = _linear([embed], [], [None], unpermute_rows, requantized, pages,
                                packs=packs, name="lm_head")
    if tied and isinstance(model.lm_head, BlockLinear):
        model.embed_tokens = PackedEmbedding(model.lm_head)  # the table once, in the head
    else:  # the file's rows, mapped: only the rows looked up are ever read in
        model.embed_tokens = StoredEmbedding(_raw_rows(embed), embed.tensor_type,
                                             config.hidden_size)
    _store_tables_(model, tensors, pages)
    if requantized:
        logger.info("GGUF matrices stored as %s run in int8 (native as stored: the block "
                    "types, F16, BF16)", ", ".join(sorted(set(requantized))))
    _say_tiles(model)
    materialize(model, device)
    model.rotary.reset_tables(device)
    with torch.no_grad():
        model.load_weights((name, shard.take(name, t))
                           for name, t in _float_tensors(tensors.values(), hf_name, pages,
                                                         layout))
    trim_heap()
    return model


def _store_tables_(model: nn.Module, tensors: dict, pages: _Pages) -> None:
    """Every other lookup table of ``model`` (an ``nn.Embedding`` child, such as Gemma 4's
    per-layer table) on the file's rows too, as a StoredEmbedding: callers look rows up by
    calling it (mutates ``model``, pops the tables from ``tensors``)."""
    for name, child in list(model.named_children()):
        table = tensors.pop(f"{name}.weight", None) if isinstance(child, nn.Embedding) else None
        if table is not None:
            setattr(model, name, StoredEmbedding(_raw_rows(table), table.tensor_type,
                                                 _shape(table)[1]))


def _say_tiles(model: nn.Module) -> None:
    """Log once how the tile types run (block_linear.tile_note): a WARNING where this level
    decodes them row by row."""
    from radixserve.kernels import native
    from radixserve.layers.block_linear import VECTOR_TILE_LEVELS, tile_note

    types = {t for m in model.modules() if isinstance(m, BlockLinear) for t in m.types}
    level = native.describe().level
    note = tile_note(sorted(types), level)
    if note:
        (logger.info if level in VECTOR_TILE_LEVELS else logger.warning)(
            "GGUF matrices%s", note.replace(";", ":", 1))


def _take(tensors: dict, name: str):
    tensor = tensors.pop(name, None)
    if tensor is None:
        raise ValueError(f"weights missing from the checkpoint: [{name!r}]")
    return tensor


def _heads(config: ModelConfig, shard: str) -> int | None:
    if shard.endswith("q_proj"):
        return config.num_heads
    return config.num_kv_heads if shard.endswith("k_proj") else None


def _shape(tensor) -> tuple[int, ...]:
    return tuple(int(d) for d in reversed(tensor.shape))


def _matrix_shape(tensor) -> tuple[int, int]:
    """A layer's weight as the matrix it is: a 1-D one (Qwen2-MoE's shared-expert gate,
    stored [hidden]) has one row."""
    shape = _shape(tensor)
    return (1, shape[0]) if len(shape) == 1 else shape


def _linear(weights: list, biases: list, heads: list, unpermute_rows, requantized: list,
            pages: _Pages, shard: TensorShard = TensorShard(),
            names: list[str] | None = None, layout=None, packs: Repack = REPACK,
            name: str = "") -> nn.Module:
    """One layer from its shards' GGUF tensors (HF ``names``, for ``shard``'s part of each): a
    BlockLinear when every shard's type has a part kind (block quantized, F16, BF16), else
    int8 on the dequantized matrices (a shard stored as F32 / F64)."""
    names = names or [""] * len(weights)
    bias = (torch.cat([shard.take(f"{s}.bias", dequantize(b.data, b.tensor_type, _shape(b)))
                       for s, b in zip(names, biases)]) if biases else None)
    orders = [unpermute_rows(_matrix_shape(t)[0], h) if unpermute_rows and h else None
              for t, h in zip(weights, heads)]
    if layout is not None:
        orders = [layout.row_order(s) for s in names]
    if not all(t.tensor_type in FORMATS for t in weights):
        requantized += [t.tensor_type.name for t in weights if t.tensor_type not in FORMATS]
        floats = [shard.take(f"{s}.weight",
                             _rows(dequantize(t.data, t.tensor_type, _matrix_shape(t)), order))
                  for s, t, order in zip(names, weights, orders)]
        for t in weights:
            pages.release(t)
        return Int8Linear.from_float(torch.cat(floats), bias)
    parts, k = [], _matrix_shape(weights[0])[1]
    for s, t, order in zip(names, weights, orders):
        block, type_size = GGML_QUANT_SIZES[t.tensor_type]
        raw, k_local = shard.take_stored(f"{s}.weight", _rows(_raw_rows(t), order), k, block,
                                         type_size)
        parts.append((t.tensor_type, raw))
    layer = BlockLinear.from_stored(parts, k_local, bias, packs, name)
    for t in weights:
        pages.release(t)
    if layer is None:
        raise ValueError("GGUF blocks as stored need the native CPU kernels "
                         "(radixserve env says why they did not load)")
    return layer


def _raw_rows(tensor) -> torch.Tensor:
    """A matrix's bytes on the file's mapping, [rows, bytes per row] uint8 (no copy)."""
    return to_torch(tensor.data).view(torch.uint8).reshape(_matrix_shape(tensor)[0], -1)


def _rows(t: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
    return t if order is None else t[order]


def _float_tensors(tensors: Iterable, hf_name, pages: _Pages, layout=None):
    for tensor in tensors:
        weight = dequantize(tensor.data, tensor.tensor_type, _shape(tensor))
        pages.release(tensor)
        name = hf_name(tensor.name)
        yield name, layout.to_hf(name, weight) if layout else weight


def materialize(model: nn.Module, device: torch.device) -> None:
    """Real (uninitialised) storage for the parameters and buffers still on the meta device."""
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and p.is_meta:
                module._parameters[name] = nn.Parameter(
                    torch.empty(p.shape, dtype=torch.float32, device=device),
                    requires_grad=False)
        for name, b in list(module._buffers.items()):
            if b is not None and b.is_meta:
                module._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device=device)


class _Pages:
    """Hands the mapped pages of a tensor read at load back to the kernel, so the file's pages
    do not stay in the process's memory beside the packed copy."""

    def __init__(self, reader) -> None:
        mapped = getattr(reader, "mapped", reader.data)  # gguf_reader.py's keeps the memmap
        self._map = getattr(mapped, "_mmap", None)
        self._base = getattr(mapped, "offset", 0)

    def release(self, tensor) -> None:
        if self._map is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        start = self._base + int(tensor.data_offset)
        aligned = start - start % mmap.PAGESIZE
        end = min(start + int(tensor.n_bytes), len(self._map))
        try:
            self._map.madvise(mmap.MADV_DONTNEED, aligned, end - aligned)
        except (OSError, ValueError):  # a mapping that cannot take the advice keeps its pages
            self._map = None


# -- the load's memory, from the tensor table alone ------------------------------------------

@dataclass(frozen=True)
class MemoryPlan:
    """What loading a GGUF file as stored holds, in bytes, from its tensor table (no weights
    read): ``weights`` the packed matrices (``by_type`` per file type), ``embedding`` the stored
    rows of a lookup table of its own (none where a packed head tied to it serves the lookups;
    on the file's mapping, so at most this much, paged in as rows are looked up),
    ``floats`` the float32 tensors (norms, biases) and int8 copies of F32-stored matrices
    (F16 / BF16 ones are ``weights``, 2 bytes a weight), ``transient`` the most the load holds
    beyond them at once (the largest layer's rows gathered; the native repack writes straight
    into the packed matrix)."""

    file: int
    weights: int
    embedding: int
    floats: int
    transient: int
    by_type: dict[str, int]

    @property
    def steady(self) -> int:
        return self.weights + self.embedding + self.floats

    @property
    def peak(self) -> int:
        return self.steady + self.transient


_FUSED = {"attn_q": "attn_qkv", "attn_k": "attn_qkv", "attn_v": "attn_qkv",
          "ffn_gate": "ffn_gate_up", "ffn_up": "ffn_gate_up",
          "ffn_gate_exps": "ffn_gate_up_exps", "ffn_up_exps": "ffn_gate_up_exps"}  # fused layers


_TABLES = ("token_embd.weight", "per_layer_token_embd.weight")  # kept as stored, by row


def memory_plan(tensors: Iterable[tuple[str, str, tuple[int, ...]]]) -> MemoryPlan:
    """``tensors``: (GGUF name, type name, row-major shape) of every tensor of a file; the same
    arithmetic as ``load_stored`` (``packed_bytes`` per matrix; a 3-D expert tensor
    [n_expert, n, k] is n_expert matrices, packed and loaded one expert at a time)."""
    tensors = list(tensors)
    tied = not any(name == "output.weight" for name, _, _ in tensors)
    by_type: dict[str, int] = {}
    file = embedding = floats = 0
    layers: dict[str, int] = {}  # the stored bytes of each layer (fused shards together)
    for name, type_name, shape in tensors:
        qtype = GGMLQuantizationType[type_name]
        block, size = GGML_QUANT_SIZES[qtype]
        numel = int(np.prod(shape))
        stored = numel // block * size
        file += stored
        if len(shape) not in (2, 3):
            floats += 4 * numel
            continue
        experts, n, k = shape if len(shape) == 3 else (1, *shape)
        is_embedding = name in _TABLES
        is_head = tied and name == "token_embd.weight"  # the head multiplies it too
        # a lookup table of its own unless a packed head tied to it serves the lookups
        embedding += stored if is_embedding and not (is_head and qtype in FORMATS) else 0
        if is_embedding and not is_head:  # a lookup table only
            continue
        if qtype in FORMATS:
            by_type[type_name] = by_type.get(type_name, 0) + experts * packed_bytes(qtype, n, k)
        else:
            floats += experts * (n * k + 4 * n)  # int8 and its scales
        parts = name.split(".")
        key = ".".join(parts[:2] + [_FUSED.get(parts[2], parts[2])]) if parts[0] == "blk" else name
        layers[key] = layers.get(key, 0) + stored // experts  # one expert's rows at a time
    return MemoryPlan(file=file, weights=sum(by_type.values()), embedding=embedding,
                      floats=floats, transient=max(layers.values(), default=0),
                      by_type=by_type)
