"""A Hugging Face folder of float16 / bfloat16 weights with its linear layers kept in 16 bits
(``--quantization 16bit-stored``, what ``auto`` picks for such folders on CPU where the native
kernels load).

Every linear (q/k/v and gate/up fused as in the float model, o, down, the head) becomes a
`BlockLinear` of F16 or BF16 parts: the checkpoint's 16-bit values as stored, multiplied by
float32 activations (``kernels/half_linear.cpp``). Norms, biases and an untied embedding table
load as float32, as in the float model; a tied one is the head's 16-bit rows, the looked-up ones
widened to float32 (layers/block_rows.py), the same values. No float32 copy of a linear weight
exists at any point: the model is built on the meta device and each matrix goes from the file
straight into the packed layout, one at a time.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Iterator

import numpy as np
import torch
from gguf import GGMLQuantizationType
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

from radixserve.models.tp_shard import TensorShard
from radixserve.layers.block_linear import BlockLinear, packed_bytes
from radixserve.layers.block_rows import PackedEmbedding
from radixserve.cpu.memory import trim_heap
from radixserve.models.gguf_stored import materialize
from radixserve.models.moe import HF_FUSED_EXPERTS, fused_expert_parts

logger = logging.getLogger(__name__)

_PART_TYPES = {torch.float16: GGMLQuantizationType.F16,
               torch.bfloat16: GGMLQuantizationType.BF16}
_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}


def checkpoint_dtype(source) -> torch.dtype | None:
    """The float type a Hugging Face folder (a ``ModelSource``) stores its linear weights in,
    from the safetensors headers (no weights read): float16, bfloat16, float32; None for a GGUF
    file, or when they differ or none is found."""
    if source.kind == "gguf":
        return None
    path = source.path
    found: set[torch.dtype | None] = set()
    for file in _files(path):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                if name.endswith("proj.weight"):
                    found.add(_DTYPES.get(f.get_slice(name).get_dtype()))
    return found.pop() if len(found) == 1 else None


def stored_bytes(source, tied: bool) -> tuple[int, int]:
    """(the 16-bit linears' packed bytes, the float32 tensors' bytes) a ``16bit-stored`` load
    of the folder holds, from its safetensors headers (``packed_bytes`` per matrix; ``tied``:
    the head packs the embedding, whose lookups read the head's rows)."""
    half = floats = 0
    for file in _files(source.path):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                shape = f.get_slice(name).get_shape()
                numel = int(np.prod(shape))
                is_embedding = name.endswith("embed_tokens.weight")
                if name.endswith(HF_FUSED_EXPERTS):  # [n_expert, rows, cols]: n matrices
                    half += shape[0] * packed_bytes(GGMLQuantizationType.F16, *shape[1:])
                    continue
                if len(shape) == 2 and (not is_embedding or tied):
                    half += packed_bytes(GGMLQuantizationType.F16, shape[0], shape[1])
                if len(shape) != 2 or (is_embedding and not tied):  # tied: the head's rows
                    floats += 4 * numel
    return half, floats


def load_half_stored(model: nn.Module, path: str, device: torch.device,
                     show_progress: bool = True,
                     shard: TensorShard = TensorShard(), rename=None) -> nn.Module:
    """Fill ``model`` (built on the meta device) from the folder at ``path``, its linear
    weights as 16-bit parts (``shard``: the tensor-parallel rank's part of each; ``rename``:
    the folder's tensor name → the model's, None to skip it, e.g. a vision tower's). ValueError
    for a missing tensor or a linear weight that is not float16 / bfloat16."""
    tensors = _Tensors(path, rename, getattr(model, "hf_expert_parts", fused_expert_parts))
    packed = getattr(model, "packed_modules", {})
    rows_of = getattr(model, "hf_row_order", lambda name: None)  # a fused matrix's own order
    linears = [(prefix, parent, name) for prefix, parent in model.named_modules()
               for name, child in parent.named_children() if isinstance(child, nn.Linear)]
    bar = tqdm(linears, desc="packing 16-bit matrices", unit="matrix",
               disable=not show_progress, leave=False, delay=1.0)
    for prefix, parent, name in bar:
        base = f"{prefix}.{name}" if prefix else name
        shards = ([base] if tensors.holds(f"{base}.weight")  # stored fused (Phi-3, Qwen3-Next)
                  else [base.rsplit(name, 1)[0] + shard for shard in packed.get(name, (name,))])
        weights = [tensors.take(f"model.{s}.weight", f"{s}.weight") for s in shards]
        weights = [shard.take(f"{s}.weight", _rows(w, rows_of(f"{s}.weight")))
                   for s, w in zip(shards, weights)]
        has_bias = getattr(parent, name).bias is not None
        bias = (torch.cat([shard.take(f"{s}.bias", tensors.take(f"model.{s}.bias",
                                                                f"{s}.bias").float())
                           for s in shards]) if has_bias else None)
        setattr(parent, name, _half_linear(weights, bias, base))
    if getattr(model, "lm_head", False) is None:  # tied: the table once, the head's 16 bits
        model.lm_head = _half_linear([tensors.peek("model.embed_tokens.weight")], None,
                                     "lm_head")
        model.embed_tokens = PackedEmbedding(model.lm_head)
        tensors.drop("model.embed_tokens.weight", "embed_tokens.weight")
    tensors.drop("lm_head.weight")  # a tied checkpoint may carry the head anyway
    materialize(model, device)
    model.rotary.reset_tables(device)
    with torch.no_grad():
        model.load_weights((name, shard.take(name, t).float()) for name, t in tensors.rest())
    trim_heap()
    kinds = sorted({t for m in model.modules() if isinstance(m, BlockLinear) for t in m.types})
    logger.info("linear layers in 16 bits as stored (%s, float32 activations, native); "
                "norms float32", "/".join(kinds))
    return model


def _half_linear(weights: list[torch.Tensor], bias: torch.Tensor | None,
                 name: str) -> BlockLinear:
    for w in weights:
        if w.dtype not in _PART_TYPES:
            raise ValueError(f"{name}: a {w.dtype} weight cannot run as a 16-bit part "
                             "(float16 or bfloat16)")
    parts = [(_PART_TYPES[w.dtype], w.contiguous().view(torch.uint8)) for w in weights]
    layer = BlockLinear.from_stored(parts, weights[0].shape[1], bias)
    if layer is None:
        raise ValueError("16-bit linear weights as stored need the native CPU kernels "
                         "(radixserve env says why they did not load)")
    return layer


def _files(path: str) -> list[str]:
    return sorted(glob.glob(os.path.join(path, "*.safetensors")))


class _Tensors:
    """The folder's tensors by name, each read when taken (the files stay memory-mapped); a
    fused 3-D expert tensor as its experts' matrices, each read alone (``parts``: the model's
    ``hf_expert_parts`` where its fused experts are laid out otherwise, gpt-oss's)."""

    def __init__(self, path: str, rename=None, parts=fused_expert_parts) -> None:
        self._handles = [safe_open(file, framework="pt") for file in _files(path)]
        rename = rename or (lambda name: name)
        # the model's name → (file, its name, the index of a part of it or None)
        self._where = {rename(name): (h, name, None) for h in self._handles
                       for name in h.keys() if rename(name) is not None}
        for name, (h, stored, _) in list(self._where.items()):
            for part, index in parts(name, h.get_slice(stored).get_shape()) or ():
                self._where.pop(name, None)
                self._where[part] = (h, stored, index)

    def take(self, *names: str) -> torch.Tensor:
        """The first of ``names`` present (with or without the ``model.`` prefix), forgotten
        after; ValueError if none is."""
        for name in names:
            found = self._where.pop(name, None)
            if found is not None:
                return _read(*found)
        raise ValueError(f"weights missing from the checkpoint: [{names[-1]!r}]")

    def holds(self, name: str) -> bool:
        """Whether ``name`` (with or without the ``model.`` prefix) is still to be taken."""
        return f"model.{name}" in self._where or name in self._where

    def peek(self, name: str) -> torch.Tensor:
        found = self._where.get(name) or self._where.get(name.removeprefix("model."))
        if found is None:
            raise ValueError(f"weights missing from the checkpoint: [{name!r}]")
        return _read(*found)

    def drop(self, *names: str) -> None:
        for name in names:
            self._where.pop(name, None)

    def rest(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name in list(self._where):
            yield name, self.take(name)


def _rows(weight: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
    return weight if order is None else weight[order]


def _read(handle, name: str, index) -> torch.Tensor:
    """A tensor of an open safetensors file, or only the part ``index`` selects of it (a
    callable: what it makes of the tensor's slice)."""
    if callable(index):
        return index(handle.get_slice(name))
    return handle.get_tensor(name) if index is None else handle.get_slice(name)[index]
