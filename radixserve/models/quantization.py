"""Which number format the linear layers compute in, and the swap of float layers for quantized.

``auto`` follows the checkpoint: a GGUF file whose layer weights are quantized (Q4_1, Q8_0,
K-quants...) runs its linears in int8 on CPU (``layers/int8_linear.py``), as llama.cpp runs
them quantized; float checkpoints, and every model on CUDA, keep float weights. Int8 and q4
run only in the native kernels, which every CPU level has (``kernels/levels.py``: exact int8
dot products with VNNI, with AVX2's maddubs, or in portable vector code): where the kernels
are not installed ``auto`` keeps float weights (native.py says so in a WARNING) and ``int8``
or ``q4`` is refused. No torch int8 GEMM serves the engine: oneDNN's was measured pathological
on CPUs with VNNI but no AMX (0.95 s for the 1-row lm_head, fp32 takes 4 ms), and torch's
``_int_mm`` is only the tests' reference.

``q4`` (CPU, native kernels) keeps a GGUF file's Q4_0 / Q4_1 matrices as the file stores them,
4-bit blocks (``layers/q4_linear.py``), and runs every other linear in int8: the weights are
exactly the file's (logits closer to the float model) in 5 bits instead of 8, and a batch-1
step reads fewer bytes, but batched steps and prefill run slower than int8 (the per-block float
epilogue) and single-stream decode measured the same as int8 (docs/benchmarks.md). So ``auto``
keeps int8, and ``q4`` is the opt-in for fidelity to the file and weight memory.
"""

from __future__ import annotations

import torch
from torch import nn

from radixserve.kernels import native
from radixserve.layers.int8_linear import Int8Linear
from radixserve.layers.q4_linear import Q4Linear

QUANTIZATIONS = ("auto", "none", "int8", "q4")
_FLOAT_GGUF_TYPES = ("F32", "F16", "BF16", "F64")


def resolve_quantization(name: str, device: torch.device, reader=None) -> str:
    """``name`` from the config → ``"none"``, ``"int8"`` or ``"q4"``; ``reader``: the GGUFReader
    of a GGUF checkpoint (None for a Hugging Face folder). ValueError for an unknown name, int8
    or q4 on a device other than the CPU or without the native kernels, q4 without a GGUF file
    holding Q4_0 / Q4_1 matrices."""
    if name not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {name!r}; supported: {list(QUANTIZATIONS)}")
    if name == "auto":
        quantized = reader is not None and _gguf_layers_quantized(reader)
        fits = device.type == "cpu" and int8_kernels_available()
        return "int8" if quantized and fits else "none"
    if name in ("int8", "q4") and device.type != "cpu":
        raise ValueError(f"{name} quantization runs on CPU only, not on {device.type!r}")
    if name in ("int8", "q4") and not int8_kernels_available():
        raise ValueError(f"{name} quantization needs the native CPU kernels (radixserve env "
                         "says why they did not load)")
    if name == "q4" and not (reader is not None and _gguf_has_q4(reader)):
        raise ValueError("q4 quantization needs a GGUF file with Q4_0 or Q4_1 matrices")
    return name


def quantize_linears_(model: nn.Module,
                      q4: dict[str, tuple[torch.Tensor, ...]] | None = None) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` with a quantized one, in place: a `Q4Linear`
    on the checkpoint's own 4-bit blocks where ``q4`` (HF weight name → ``(codes, d, m)``,
    from the GGUF loader) holds every matrix stacked in it and the native kernels load, else an
    `Int8Linear`. A head tied to the embedding (``model.lm_head is None``) gets its own int8
    copy of the embedding matrix; the lookup table stays float."""
    q4 = q4 or {}
    packed = getattr(model, "packed_modules", {})
    for prefix, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            base = f"{prefix}.{name}" if prefix else name
            shards = [base.rsplit(name, 1)[0] + shard for shard in packed.get(name, (name,))]
            blocks = [q4.get(f"{shard}.weight") for shard in shards]
            layer = None
            if all(b is not None for b in blocks):
                q, d, m = (torch.cat(parts) for parts in zip(*blocks))
                layer = Q4Linear.from_blocks(q, d, m, child.bias)
            setattr(parent, name, layer or Int8Linear.from_float(child.weight, child.bias))
    if getattr(model, "lm_head", False) is None:
        model.lm_head = Int8Linear.from_float(model.embed_tokens.weight)
    return model


def int8_kernels_available() -> bool:
    """True where the native kernels load: their int8 and 4-bit linears run on every level."""
    return native.load() is not None


def _gguf_has_q4(reader) -> bool:
    return any(t.tensor_type.name in ("Q4_0", "Q4_1") and len(t.shape) == 2
               for t in reader.tensors)


def _gguf_layers_quantized(reader) -> bool:
    """True if the transformer blocks' matrices are stored in a quantized GGUF type."""
    types = {t.tensor_type.name for t in reader.tensors
             if t.name.startswith("blk.") and len(t.shape) == 2}
    return bool(types - set(_FLOAT_GGUF_TYPES))
