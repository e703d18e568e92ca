"""Batched LoRA: each row of a packed batch gets its own adapter's delta, or none.

    y = W x                                   (the base linear, whole batch, as without LoRA)
    y[rows of a] += B_a (A_a x[rows of a])    for each adapter a in the step (scale in B_a)

The delta is applied by a forward hook on each fused linear (qkv, o, gate_up, down) that reads
the step's `LoraBatch` from the forward context (installed by runner/lora_set.py): rows are grouped by adapter (``index_select``,
two torch GEMMs, ``index_add_``); rows with no adapter are never touched. The GEMMs are torch's
(no dedicated native kernel is written): at rank 16 they are a few percent of a linear's work.
A row's delta depends only on its own input and adapter, so its result does not depend on the
other rows' adapters (up to the GEMM's own choice of blocking for the group's row count).

Null objects keep the plain path free: a model with no adapter ever loaded has no hooks; a
step with no adapter row carries `NO_LORA` (its hooks return at once, and its layer stack is
the model's own, e.g. the native one-call-per-layer stack). A step with adapter rows runs the
Python layers (the native stack has no LoRA; they compute the same bits for the base part).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from radixserve.layers.forward_context import NO_LORA, NoLoraBatch  # noqa: F401


class LoraBatch:
    """The step's adapter groups: ``groups`` of (adapter layers, token rows or None for all
    rows); built per step by the runner (`LoraSet.batch`), read-only afterwards."""

    def __init__(self, groups: list[tuple[dict, torch.Tensor | None]]) -> None:
        self.groups = groups

    def apply(self, key: tuple[int, str], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y`` (the base linear's output for input ``x``) plus each row's delta, in place."""
        for layers, rows in self.groups:
            ab = layers.get(key)
            if ab is None:  # this adapter leaves this linear alone
                continue
            a, b = ab
            xs = x if rows is None else x.index_select(0, rows)
            delta = torch.matmul(torch.matmul(xs.to(a.dtype), a.t()), b.t()).to(y.dtype)
            if rows is None:
                y.add_(delta)
            else:
                y.index_add_(0, rows, delta)
        return y

    def stack(self, plain: Callable, python: Callable) -> Callable:
        return python
