"""Tiny GGUF models whose matrices are of a type gguf-py cannot quantize (Q3_K, the IQ types,
MXFP4, TQ1_0 ...): ``with_random_matrices(src, out, qtype)`` copies a GGUF file (metadata,
tokenizer, norms) and replaces every matrix (2-D, and 3-D expert stacks) by ``gguf_blocks.random_rows`` of ``qtype``.

A random model is as good as any for the tests that use it: they compare the engine on the
file's blocks with the float model on the same file dequantized (gguf-py's reference), so both
hold the very same weights.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf_blocks import random_rows

__all__ = ["with_random_matrices"]


def _copy_fields(reader: gguf.GGUFReader, writer: gguf.GGUFWriter) -> None:
    """Every key of ``reader`` but the header's and the architecture (the writer adds those),
    as gguf-py's own gguf_new_metadata.py copies them."""
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub_type)


def with_random_matrices(src: str | Path, out: str | Path, qtype: gguf.GGMLQuantizationType,
                         seed: int = 0, gain: float = 2.0) -> Path:
    """Write ``out``: the GGUF ``src`` with each matrix (layer matrices, token_embd, output,
    3-D expert stacks) replaced by random rows of ``qtype`` of its shape, the largest weights about
    ``gain`` / sqrt(K) (a layer's output about its input's size: random layers of larger weights
    grow every rounding error layer after layer, any type's alike), every other tensor as it
    is. Returns ``out``."""
    reader = gguf.GGUFReader(str(src))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out), reader.fields["general.architecture"].contents())
    _copy_fields(reader, writer)
    for i, tensor in enumerate(reader.tensors):
        shape = tuple(int(d) for d in reversed(tensor.shape))  # row-major
        if len(shape) in (2, 3):  # 3-D: experts [n_expert, n, k]
            rows = random_rows(qtype, int(np.prod(shape[:-1])), shape[-1], seed=seed + i,
                               scale=gain / shape[-1] ** 0.5)
            writer.add_tensor(tensor.name, rows.reshape(*shape[:-1], -1), raw_dtype=qtype)
        else:
            writer.add_tensor(tensor.name, np.array(tensor.data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
