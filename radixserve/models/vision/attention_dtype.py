"""The element type of a vision tower's attention (the patches' scores and weighted sums).

A SigLIP tower at 896 px attends over 4,096 patches in each of its 27 layers: in float32 that
is 40% of an image's encode on a 2-core CPU (torch's flash attention runs near the float32
FMA peak). Where the CPU has AMX tiles, torch's bfloat16 flash attention is about 3x faster
(4,096 x 4,096 patches, 16 heads of 72: 102 ms against 310 ms, Intel Xeon, AMX), and bfloat16
is the released checkpoints' own type (Gemma 3 is trained and shipped in bfloat16); the
output then differs from float32 by ~1e-3 of its scale. Elsewhere bfloat16 is no faster, so
float32 stays. ``RADIXSERVE_VISION_ATTENTION`` (``float32`` | ``bfloat16``) fixes it.
"""

from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger(__name__)

ENV = "RADIXSERVE_VISION_ATTENTION"
_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def vision_attention_dtype(device: torch.device, dtype: torch.dtype) -> tuple[torch.dtype, str]:
    """(the attention's element type, why) for a tower run in ``dtype`` on ``device``;
    ValueError for an unknown ``RADIXSERVE_VISION_ATTENTION``."""
    return _choose(ENV, device, dtype, "AMX: bfloat16 flash attention, ~3x float32's",
                   "float32 (no AMX)")


MATMUL_ENV = "RADIXSERVE_VISION_MATMUL"


def vision_matmul_dtype(device: torch.device, dtype: torch.dtype) -> tuple[torch.dtype, str]:
    """(the element type a vision tower's 16-bit matrices multiply in, why): bfloat16 where
    the CPU has AMX tiles (torch's bfloat16 GEMM runs on them: ~5x the float32 FMA peak that
    the stored-F16 kernel reaches; the releases' weights are bfloat16 values, which an F16
    mmproj holds exactly, so only the activations round), else the tower's ``dtype``.
    ``RADIXSERVE_VISION_MATMUL`` (``float32`` | ``bfloat16``) fixes it; ValueError for
    another value."""
    return _choose(MATMUL_ENV, device, dtype, "AMX: bfloat16 GEMM", "no AMX")


def _choose(env: str, device: torch.device, dtype: torch.dtype, amx_why: str,
            other_why: str) -> tuple[torch.dtype, str]:
    """``env``'s type where set (ValueError for an unknown one), else bfloat16 for a float32
    tower on a CPU with AMX tiles, else ``dtype``."""
    asked = os.environ.get(env)
    if asked:
        if asked not in _NAMES:
            raise ValueError(f"{env}={asked!r}: expected one of {sorted(_NAMES)}")
        return _NAMES[asked], f"{env}={asked}"
    if device.type != "cpu" or dtype != torch.float32:
        return dtype, "the tower's dtype"
    from radixserve.kernels import native

    if native.load() is not None and native.describe().amx_tiles:
        return torch.bfloat16, amx_why
    return dtype, other_why
