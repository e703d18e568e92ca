"""Batched LoRA: each row of a packed batch gets its own adapter's delta, or none.

    y = W x                                   (the base linear, whole batch, as without LoRA)
    y[row] += B_a (A_a x[row])                for each row whose adapter a touches this linear

The delta is applied by a forward hook on each fused linear (qkv, o, gate_up, down) that reads
the step's `LoraBatch` from the forward context (installed by runner/lora_set.py). Rows with no
adapter, or whose adapter leaves this linear alone, are never touched.

Two paths compute the delta, chosen per step (logged once per process when it changes):

* native (the CPU kernels loaded, float32 rows and adapters on the CPU): kernels/lora.cpp,
  one call pair per linear for the whole step, ``rs_lora_shrink`` (t = A_s x) then
  ``rs_lora_expand`` (y += B_s t) with s each row's slot (its group's index; -1 for none).
  Every output element is one fixed-order dot product over that row's own data, so a row's
  result is bit-identical in any batch and with any thread count (by construction; see
  the kernel's comment). No tiles, no padding, no gathers, no scatter.
* torch (``RADIXSERVE_NATIVE_KERNELS=0``, another dtype or device): the tiles below.

Batch invariance on the torch path (a row's delta does not depend on the other rows of the
step): the adapter rows are gathered once per linear into tiles of exactly ``TILE`` rows, each
tile holding rows of one adapter (the last tile of an adapter padded with copies of one of its
rows), and each tile goes through its own two ``torch.mm`` calls, ``[TILE, K] @ A_a.T`` then
``[TILE, r] @ B_a.T``. So every product a row takes part in has a shape fixed by its adapter
alone (TILE, K, r_a, N), whatever the step holds, how many rows share its adapter, or where in
its tile the row lands; a GEMM of a fixed shape computes a row from that row's values only (as
runner/prompt_logprobs.py relies on; tests/models/test_lora_invariance.py pins it bit for bit at
the realistic shapes). The row's delta is then added to its output once (``y + d``, one
rounding), so its output is the same alone, beside rows of its own adapter, of others, or of
none. (Torch's GEMMs on one group of M rows, the previous scheme, differ in the last bits
between M = 1, a matrix-vector kernel, and M > 1.)

Cost on the native path: per linear, two kernel calls over the step's rows (no per-row or
per-tile Python work). Paired with the tile GEMMs on benchmarks/lora_cost.py (batch 16, rank 16,
2 CPUs shared with a test run, load average 3.1-3.9, so indicative only): every row on one
adapter 521 tok/s against 279, rows over 4 adapters 416 against 309 (first pair; see the commit
message for both).

Cost on the torch path: per linear, one gather of the adapter rows, two small GEMMs per tile,
one gather of the deltas and one add (or one indexed copy when some rows have no adapter); no
per-row work. A mixed step runs ``sum over adapters of ceil(rows_a / TILE)`` tiles. Measured
with benchmarks/lora_cost.py (batch 16, rank 16, 2 busy CPUs, load average 1.9; indicative),
against the grouped GEMMs it replaced: every row on one adapter 633 / 622 tok/s (was 691 / 680:
a 16-row group now takes two 8-row tiles), rows over 4 adapters 434 / 444 (was 423 / 419: no
per-row ``index_add_``). Stacking the adapters present into one GEMM would save calls but give a
row's product a shape set by the other adapters in the step, which this layout forbids.

Null objects keep the plain path free: a model with no adapter ever loaded has no hooks; a
step with no adapter row carries `NO_LORA` (its hooks return at once, and its layer stack is
the model's own, e.g. the native one-call-per-layer stack). A step with adapter rows runs the
Python layers (the native stack has no LoRA; they compute the same bits for the base part).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch

from radixserve.kernels import native, ops
from radixserve.layers.forward_context import NO_LORA, NoLoraBatch  # noqa: F401

logger = logging.getLogger(__name__)

TILE = 8
"""Rows per LoRA product. Small: a decode step spreads few rows over each adapter, and a
tile's padding is computed for nothing; large: a long prefill takes more calls."""


class LoraBatch:
    """The step's adapter rows laid out in tiles (see the module docstring); built once per
    step by `build`, read-only afterwards except its cache of scatter indices.

    ``groups``: (adapter layers, first tile, number of tiles) per adapter present;
    ``src``: the row of ``x`` behind each tile row (``[num_tiles * TILE]``; None when those are
    the rows of ``x`` in order, e.g. one adapter on a multiple of ``TILE`` rows);
    ``row_slot``: each row's group index (int32 ``[num_rows]``, -1 for none), on the native
    path only (None on the torch path)."""

    def __init__(self, groups: list[tuple[dict, int, int]], src: torch.Tensor | None,
                 rows: list[np.ndarray], num_rows: int,
                 row_slot: torch.Tensor | None = None) -> None:
        self.groups, self.src, self.row_slot = groups, src, row_slot
        self._rows, self._num_rows = rows, num_rows
        self._fallback: LoraBatch | None = None
        self._scatter: dict[tuple[bool, ...], tuple[torch.Tensor | None, torch.Tensor | None]] = {}

    @classmethod
    def build(cls, groups: list[tuple[dict, np.ndarray]], num_rows: int,
              device: torch.device, native_ok: bool = True) -> LoraBatch:
        """From (adapter layers, its token rows ascending) per adapter present in the step,
        of ``num_rows`` packed rows; every row in at most one group."""
        if native_ok and _native_path(device):
            slot = np.full(num_rows, -1, dtype=np.int32)
            for i, (_, rows) in enumerate(groups):
                slot[rows] = i
            return cls([(layers, 0, 0) for layers, _ in groups], None,
                       [rows for _, rows in groups], num_rows, torch.from_numpy(slot))
        src, tiles, first = [], [], 0
        for layers, rows in groups:
            num_tiles = -(-len(rows) // TILE)
            pad = num_tiles * TILE - len(rows)
            src.append(rows if not pad else np.concatenate([rows, np.repeat(rows[-1:], pad)]))
            tiles.append((layers, first, num_tiles))
            first += num_tiles
        index = np.concatenate(src).astype(np.int64)
        if len(index) == num_rows and (index == np.arange(num_rows)).all():
            return cls(tiles, None, [rows for _, rows in groups], num_rows)
        return cls(tiles, torch.from_numpy(index).to(device), [rows for _, rows in groups],
                   num_rows)

    def apply(self, key: tuple[int, str], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y`` (the base linear's output for input ``x``) plus each row's delta, in place."""
        present = tuple(key in layers for layers, _, _ in self.groups)
        if not any(present):
            return y
        a0 = next(layers[key][0] for layers, _, _ in self.groups if key in layers)
        if self.row_slot is not None and a0.dtype == x.dtype == y.dtype == torch.float32:
            slots = ops.LoraSlots([layers.get(key) for layers, _, _ in self.groups])
            return ops.lora_add_(x if x.stride(-1) == 1 else x.contiguous(), y, self.row_slot,
                                 slots)
        if self.row_slot is not None:  # built for the native path; another dtype here
            return self._torch_fallback().apply(key, x, y)
        xs = (x if self.src is None else x.index_select(0, self.src)).to(a0.dtype)
        d = xs.new_empty(xs.shape[0], y.shape[1])  # rows of groups without ``key`` stay unread
        for (layers, first, num_tiles), has in zip(self.groups, present):
            if not has:
                continue
            a, b = layers[key]
            at, bt = a.t(), b.t()
            for t in range(first * TILE, (first + num_tiles) * TILE, TILE):
                torch.mm(torch.mm(xs[t:t + TILE], at), bt, out=d[t:t + TILE])
        dst, back = self._scatter.get(present) or self._scatter_for(present, x.device)
        delta = (d if back is None else d.index_select(0, back)).to(y.dtype)
        if dst is None:
            y.add_(delta)
        else:
            y.index_copy_(0, dst, y.index_select(0, dst).add_(delta))
        return y

    def _scatter_for(self, present: tuple[bool, ...], device: torch.device):
        """(the rows of ``y`` to update, None for all in order; the tile rows holding their
        deltas, None when those are the tile rows in order) for the groups flagged in
        ``present``; cached for the step."""
        dst, back = [], []
        for (_, first, _), rows, has in zip(self.groups, self._rows, present):
            if has:
                dst.append(rows)
                back.append(first * TILE + np.arange(len(rows)))
        dst_rows, back_rows = np.concatenate(dst), np.concatenate(back)
        order = np.argsort(dst_rows, kind="stable")
        dst_rows, back_rows = dst_rows[order], back_rows[order]
        every = len(dst_rows) == self._num_rows  # then dst_rows is 0..num_rows-1
        num_tile_rows = sum(num_tiles for _, _, num_tiles in self.groups) * TILE
        in_order = len(back_rows) == num_tile_rows and bool(
            (back_rows == np.arange(len(back_rows))).all())
        out = (None if every else torch.from_numpy(dst_rows.astype(np.int64)).to(device),
               None if in_order else torch.from_numpy(back_rows.astype(np.int64)).to(device))
        self._scatter[present] = out
        return out

    def _torch_fallback(self) -> LoraBatch:
        """This step laid out in tiles for the torch path (built once, on first need)."""
        if self._fallback is None:
            self._fallback = LoraBatch.build(
                [(layers, rows) for (layers, _, _), rows in zip(self.groups, self._rows)],
                self._num_rows, self.row_slot.device, native_ok=False)
        return self._fallback

    def stack(self, plain: Callable, python: Callable) -> Callable:
        return python


_logged_path: list[str] = []  # the path last logged (one entry after the first step)


def _native_path(device: torch.device) -> bool:
    """Whether this step's deltas go through the native kernels (the CPU kernels loaded and the
    rows on the CPU); logs the path on the first step and whenever it changes."""
    path = "native" if torch.device(device).type == "cpu" and native.load() is not None \
        else "torch"
    if _logged_path != [path]:
        _logged_path[:] = [path]
        logger.info("LoRA deltas: %s", "native per-row kernels (kernels/lora.cpp)"
                    if path == "native" else "torch tile GEMMs")
    return path == "native"
