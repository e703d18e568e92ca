"""The IQ types' codebooks for the native kernels (tile_linear.cpp: rs_tile_grids), taken from
gguf-py, the reference every file type is decoded by (``gguf.quants``): one int8 table, the
grids one after another as signed bytes, then ksigns."""

from __future__ import annotations

from functools import cache

import numpy as np
from gguf import quants


@cache
def table() -> np.ndarray:
    """iq2xxs [256][8], iq2xs [512][8], iq2s [1024][8], iq3xxs [256][4], iq3s [512][4], iq1s
    [2048][8] (-1, 0, 1), then ksigns [128]: int8, contiguous (the layout rs_tile_grids reads)."""
    parts = []
    for cls, shape in ((quants.IQ2_XXS, (256, 8)), (quants.IQ2_XS, (512, 8)),
                       (quants.IQ2_S, (1024, 8)), (quants.IQ3_XXS, (256, 4)),
                       (quants.IQ3_S, (512, 4)), (quants.IQ1_S, (2048, 8))):
        cls.init_grid()
        grid = np.asarray(cls.grid, dtype=np.float32).reshape(shape)
        parts.append(grid.astype(np.int8).reshape(-1))
    parts.append(np.frombuffer(quants.IQ2_XXS.ksigns, dtype=np.uint8).view(np.int8))
    return np.ascontiguousarray(np.concatenate(parts))
