"""A model's fingerprint: a hash of everything that changes the numbers in its KV pages, so a
page is only ever read back by an engine that would have computed the same bytes. Its hex
names the store's folder (store.py). Torch-free: the engine passes the resolved values in.

What goes in: the model files' identity (resolved path, size and mtime of the GGUF, or of a
folder's config.json and weight files: a re-downloaded or edited model is another model),
the quantization mode, the model's and the pool's element types, the pages' tokens
(block size), the pool row's geometry (layers, KV heads, row width), the tensor-parallel size,
the device type and the native kernel level (its matmuls may round differently from another
level's or torch's, so a page computed at another level could differ in its last bits from
the one this engine computes), and `FORMAT` (the payload's layout). Threads and batching do
not go in: a restored page is as exact as one the radix tree kept in memory (with a batch-
invariant compute type, docs/models.md, the same bytes as computing it again).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass

FORMAT = 1  # the payload's layout: per layer its K rows then V rows (kvdisk/tier.py)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".json", ".model")


@dataclass(frozen=True)
class ModelIdentity:
    """What changes a page's bytes, as the engine resolved it."""

    model_path: str
    quantization: str
    model_dtype: str
    kv_dtype: str
    block_size: int
    num_layers: int
    num_kv_heads: int
    row_width: int
    tensor_parallel_size: int
    device: str
    kernel_level: str | None

    def fingerprint(self) -> bytes:
        """32 bytes: sha256 over these fields, the files' identity and `FORMAT`."""
        fields = {**asdict(self), "model_path": os.path.realpath(self.model_path),
                  "files": files_identity(self.model_path), "format": FORMAT}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).digest()


def files_identity(path: str) -> list[tuple[str, int, int]]:
    """``(path, size, mtime_ns)`` of the model file, or of a folder's config and weight
    files (sorted), their paths resolved: a model reached through a symlink (a --models-dir
    folder of links, the Hugging Face cache's snapshots) is the model it links to."""
    path = os.path.realpath(path)
    if os.path.isfile(path):
        paths = [path]
    else:
        paths = sorted(os.path.join(path, name) for name in os.listdir(path)
                       if name.endswith(_WEIGHT_SUFFIXES))
    out = []
    for p in paths:
        st = os.stat(p)
        out.append((os.path.realpath(p), st.st_size, st.st_mtime_ns))
    return out
