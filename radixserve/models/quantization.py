"""Which number format the linear layers compute in, and the swap of float layers for quantized.

``auto`` follows the checkpoint: a GGUF file whose layer matrices are quantized runs them as
the file stores them (``gguf``: Q4_0 ... Q6_K blocks through ``layers/block_linear.py``, loaded
without a float copy by ``models/gguf_stored.py``), as llama.cpp does; float checkpoints, and
every model on CUDA, keep float weights. ``int8`` requantizes every linear per output channel
(``layers/int8_linear.py``; any checkpoint), by name only. Both run only in the native kernels,
which every CPU level has (``kernels/levels.py``): where the kernels are not installed ``auto``
keeps float weights (native.py says so in a WARNING) and ``gguf`` or ``int8`` is refused. No
torch int8 GEMM serves the engine: oneDNN's was measured pathological on CPUs with VNNI but no
AMX (0.95 s for the 1-row lm_head, fp32 takes 4 ms), and torch's ``_int_mm`` is only the tests'
reference.
"""

from __future__ import annotations

import torch
from torch import nn

from radixserve.kernels import native
from radixserve.layers.int8_linear import Int8Linear

QUANTIZATIONS = ("auto", "none", "int8", "gguf")
_FLOAT_GGUF_TYPES = ("F32", "F16", "BF16", "F64")


def resolve_quantization(name: str, device: torch.device, reader=None) -> str:
    """``name`` from the config → ``"none"``, ``"int8"`` or ``"gguf"``; ``reader``: the
    GGUFReader of a GGUF checkpoint (None for a Hugging Face folder). ValueError for an unknown
    name, int8 or gguf on a device other than the CPU or without the native kernels, gguf
    without a GGUF file holding block-quantized matrices."""
    if name not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {name!r}; supported: {list(QUANTIZATIONS)}")
    if name == "auto":
        quantized = reader is not None and _gguf_layers_quantized(reader)
        fits = device.type == "cpu" and int8_kernels_available()
        return "gguf" if quantized and fits else "none"
    if name in ("int8", "gguf") and device.type != "cpu":
        raise ValueError(f"{name} quantization runs on CPU only, not on {device.type!r}")
    if name in ("int8", "gguf") and not int8_kernels_available():
        raise ValueError(f"{name} quantization needs the native CPU kernels (radixserve env "
                         "says why they did not load)")
    if name == "gguf" and not (reader is not None and _gguf_layers_quantized(reader)):
        raise ValueError("gguf quantization (the file's blocks as stored) needs a GGUF file "
                         "with block-quantized layer matrices")
    return name


def quantize_linears_(model: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` with an `Int8Linear`, in place. A head tied to
    the embedding (``model.lm_head is None``) gets its own int8 copy of the embedding matrix;
    the lookup table stays float."""
    for _, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, Int8Linear.from_float(child.weight, child.bias))
    if getattr(model, "lm_head", False) is None:
        model.lm_head = Int8Linear.from_float(model.embed_tokens.weight)
    return model


def int8_kernels_available() -> bool:
    """True where the native kernels load: their int8 and 4-bit linears run on every level."""
    return native.load() is not None


def _gguf_layers_quantized(reader) -> bool:
    """True if the transformer blocks' matrices are stored in a quantized GGUF type."""
    types = {t.tensor_type.name for t in reader.tensors
             if t.name.startswith("blk.") and len(t.shape) in (2, 3)}  # 3-D: experts
    return bool(types - set(_FLOAT_GGUF_TYPES))
