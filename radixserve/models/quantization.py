"""Which number format the linear layers compute in, and the swap of float layers for int8.

``auto`` follows the checkpoint: a GGUF file whose layer weights are quantized (Q4_1, Q8_0,
K-quants...) runs its linears in int8 on CPU (``layers/int8_linear.py``), as llama.cpp runs
them quantized; float checkpoints, and every model on CUDA, keep float weights. Int8 needs a
CPU with int8 dot-product instructions (VNNI; AMX CPUs have them): without them oneDNN sums
byte pairs into 16 bits with saturation and leaves s8×s8 overflow to the caller ("Nuances of
int8 computations" in its guide), so full-range int8 operands could give wrong sums there;
``auto`` then keeps float weights and ``int8`` is refused.
"""

from __future__ import annotations

import torch
from torch import nn

from radixserve.layers.int8_linear import Int8Linear

QUANTIZATIONS = ("auto", "none", "int8")
_FLOAT_GGUF_TYPES = ("F32", "F16", "BF16", "F64")


def resolve_quantization(name: str, device: torch.device, reader=None) -> str:
    """``name`` from the config → ``"none"`` or ``"int8"``; ``reader``: the GGUFReader of a GGUF
    checkpoint (None for a Hugging Face folder). ValueError for an unknown name, or int8 on a
    device other than the CPU or on a CPU without VNNI."""
    if name not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {name!r}; supported: {list(QUANTIZATIONS)}")
    if name == "auto":
        quantized = reader is not None and _gguf_layers_quantized(reader)
        fits = device.type == "cpu" and cpu_has_int8_dot()
        return "int8" if quantized and fits else "none"
    if name == "int8" and device.type != "cpu":
        raise ValueError(f"int8 quantization runs on CPU only, not on {device.type!r}")
    if name == "int8" and not cpu_has_int8_dot():
        raise ValueError("int8 quantization needs a CPU with VNNI (or AMX) int8 dot products")
    return name


def quantize_linears_(model: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` with an `Int8Linear`, in place. A head tied to
    the embedding (``model.lm_head is None``) gets its own int8 copy of the embedding matrix;
    the lookup table stays float."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, Int8Linear.from_float(child.weight, child.bias))
    if getattr(model, "lm_head", False) is None:
        model.lm_head = Int8Linear.from_float(model.embed_tokens.weight)
    return model


def cpu_has_int8_dot() -> bool:
    """True if the CPU has VNNI int8 dot products (torch's own CPU feature probe)."""
    probe = getattr(torch.cpu, "_is_vnni_supported", None)
    return bool(probe is not None and probe())


def _gguf_layers_quantized(reader) -> bool:
    """True if the transformer blocks' matrices are stored in a quantized GGUF type."""
    types = {t.tensor_type.name for t in reader.tensors
             if t.name.startswith("blk.") and len(t.shape) == 2}
    return bool(types - set(_FLOAT_GGUF_TYPES))
