"""Which number format the linear layers compute in, and the swap of float layers for quantized.

``auto`` follows the checkpoint: a GGUF file whose layer matrices are quantized or 16-bit runs
them as the file stores them (``gguf``: every block type, F16 and BF16 through
``layers/block_linear.py``, loaded without a float copy by ``models/gguf_stored.py``), as
llama.cpp does; a Hugging Face folder in float16 / bfloat16 keeps its linear weights in 16 bits
(``16bit-stored``, ``models/half_stored.py``); float32 checkpoints, and every model on CUDA,
keep float weights. ``int8`` requantizes every linear per output channel
(``layers/int8_linear.py``; any checkpoint), by name only. Both run only in the native kernels,
which every CPU level has (``kernels/levels.py``): where the kernels are not installed ``auto``
keeps float weights (native.py says so in a WARNING) and ``gguf``, ``16bit-stored`` or
``int8`` is refused. No
torch int8 GEMM serves the engine: oneDNN's was measured pathological on CPUs with VNNI but no
AMX (0.95 s for the 1-row lm_head, fp32 takes 4 ms), and torch's ``_int_mm`` is only the tests'
reference.
"""

from __future__ import annotations

import torch
from torch import nn

from radixserve.kernels import native
from radixserve.layers.int8_linear import Int8Linear

QUANTIZATIONS = ("auto", "none", "int8", "gguf", "16bit-stored")
_WIDE_GGUF_TYPES = ("F32", "F64")  # float matrices no stored part runs (they go to int8)
_NATIVE = ("int8", "gguf", "16bit-stored")


def resolve_quantization(name: str, device: torch.device, reader=None,
                         checkpoint_dtype: torch.dtype | None = None) -> str:
    """``name`` from the config → ``"none"``, ``"int8"``, ``"gguf"`` or ``"16bit-stored"``;
    ``reader``: the GGUFReader of a GGUF checkpoint (None for a Hugging Face folder),
    ``checkpoint_dtype``: a folder's stored float type (``half_stored.checkpoint_dtype``).
    ValueError for an unknown name, a native mode on a device other than the CPU or without
    the native kernels, gguf without a GGUF file holding block-quantized or 16-bit layer
    matrices, 16bit-stored without a float16 / bfloat16 Hugging Face folder."""
    if name not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {name!r}; supported: {list(QUANTIZATIONS)}")
    half_folder = reader is None and checkpoint_dtype in (torch.float16, torch.bfloat16)
    if name == "auto":
        fits = device.type == "cpu" and int8_kernels_available()
        if fits and reader is not None and _gguf_layers_stored(reader):
            return "gguf"
        return "16bit-stored" if fits and half_folder else "none"
    if name in _NATIVE and device.type != "cpu":
        raise ValueError(f"{name} quantization runs on CPU only, not on {device.type!r}")
    if name in _NATIVE and not int8_kernels_available():
        raise ValueError(f"{name} quantization needs the native CPU kernels (radixserve env "
                         "says why they did not load)")
    if name == "gguf" and not (reader is not None and _gguf_layers_stored(reader)):
        raise ValueError("gguf quantization (the file's matrices as stored) needs a GGUF file "
                         "with block-quantized, F16 or BF16 layer matrices")
    if name == "16bit-stored" and not half_folder:
        raise ValueError("16bit-stored (16-bit linear weights as stored) needs a Hugging "
                         "Face folder of float16 or bfloat16 weights; GGUF files: gguf")
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


def _gguf_layers_stored(reader) -> bool:
    """True if the transformer blocks' matrices are stored in a type a stored part runs (a
    quantized type, F16, BF16)."""
    types = {t.tensor_type.name for t in reader.tensors
             if t.name.startswith("blk.") and len(t.shape) in (2, 3)}  # 3-D: experts
    return bool(types - set(_WIDE_GGUF_TYPES))
