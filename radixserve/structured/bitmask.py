"""Applying a grammar bitmask to a batch of logits with vectorised ops."""

from __future__ import annotations

import numpy as np
import torch

from radixserve.kernels import native, ops


def banned_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Bool ``[rows, vocab_size]``: True where the bit of that token is 0 (not allowed).

    Word w, bit b (least significant first) is token ``32 * w + b``; on a little-endian host
    the bytes of the int32 words are in that order, so numpy's little-endian ``unpackbits``
    yields tokens in vocabulary order in one pass.
    """
    words = bitmask.cpu().contiguous().numpy()
    bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")
    return torch.from_numpy(bits[:, :vocab_size] == 0)


def apply_bitmask(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> None:
    """In place: ``logits[rows[i], t] = -inf`` wherever row i of ``bitmask`` bans token t
    (one native pass over the packed bits on CPU float32 logits where the kernels load)."""
    if logits.is_cpu and native.load() is not None:  # CPU logits: float32 (the sampler's)
        ops.apply_bitmask(logits, rows.to(torch.int64).contiguous(),
                          bitmask.to(torch.int32).contiguous())
        return
    banned = banned_tokens(bitmask, logits.shape[1]).to(logits.device)
    logits[rows] = logits[rows].masked_fill(banned, float("-inf"))
