"""The per-row LoRA kernel (kernels/lora.cpp through ``ops.lora_add_``), at every CPU level
this machine runs: against a float64 reference at odd shapes, a row bit-identical alone and in
any batch of mixed adapters and none, the same bits with 1 or more threads; and which path
``LoraBatch`` takes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixserve.kernels import native, ops
from radixserve.layers import lora
from radixserve.layers.lora import LoraBatch


def _slots(gen: torch.Generator, k: int, n: int, ranks: list[int | None]) -> ops.LoraSlots:
    return ops.LoraSlots([None if r is None else
                          (torch.randn(r, k, generator=gen), torch.randn(n, r, generator=gen) * 0.1)
                          for r in ranks])


def _reference(x, y, row_slot, slots: ops.LoraSlots) -> torch.Tensor:
    out = y.double().clone()
    for m, s in enumerate(row_slot.tolist()):
        if s >= 0 and slots.slots[s] is not None:
            a, b = slots.slots[s]
            out[m] += b.double() @ (a.double() @ x[m].double())
    return out


def _needs_kernels(level: str) -> None:
    if level == "none":
        pytest.skip("no kernel library is installed")


@pytest.mark.parametrize(("k", "n"), [(1, 1), (15, 17), (37, 29), (576, 960), (1000, 3)])
def test_matches_float64_at_odd_shapes(kernel_level, k, n):
    _needs_kernels(kernel_level)
    gen = torch.Generator().manual_seed(k * 7 + n)
    for ranks in ([1], [7, 16, None], [17, 33, 64], [64, 1, None, 5]):
        slots = _slots(gen, k, n, ranks)
        for rows in (1, 2, 9, 37):
            x, y = torch.randn(rows, k, generator=gen), torch.randn(rows, n, generator=gen)
            row_slot = torch.randint(-1, len(ranks), (rows,), generator=gen, dtype=torch.int32)
            want = _reference(x, y, row_slot, slots)
            got = ops.lora_add_(x, y.clone(), row_slot, slots)
            scale = 1 + want.abs().max().item()
            assert (got.double() - want).abs().max().item() <= 1e-5 * scale * max(1, k) ** 0.5
            untouched = [m for m, s in enumerate(row_slot.tolist())
                         if s < 0 or ranks[s] is None]
            assert torch.equal(got[untouched], y[untouched])


def test_a_row_is_bit_identical_alone_and_in_any_batch(kernel_level):
    _needs_kernels(kernel_level)
    gen = torch.Generator().manual_seed(1)
    k, n = 579, 301
    slots = _slots(gen, k, n, [16, 8, None, 64])
    x0, y0 = torch.randn(1, k, generator=gen), torch.randn(1, n, generator=gen)
    for mine in (0, 1, 3):
        alone = ops.lora_add_(x0, y0.clone(), torch.tensor([mine], dtype=torch.int32), slots)[0]
        for rows in range(1, 38, 3):
            x, y = torch.randn(rows, k, generator=gen), torch.randn(rows, n, generator=gen)
            row_slot = torch.randint(-1, 4, (rows,), generator=gen, dtype=torch.int32)
            at = rows // 2
            x[at], y[at], row_slot[at] = x0[0], y0[0], mine
            out = ops.lora_add_(x, y.clone(), row_slot, slots)
            assert torch.equal(out[at], alone), (mine, rows)


def test_the_thread_count_does_not_change_a_bit(kernel_level):
    _needs_kernels(kernel_level)
    gen = torch.Generator().manual_seed(2)
    k, n, rows = 2048, 3072, 37  # large enough that both kernels run in parallel
    slots = _slots(gen, k, n, [16, 64, None])
    x, y = torch.randn(rows, k, generator=gen), torch.randn(rows, n, generator=gen)
    row_slot = torch.randint(-1, 3, (rows,), generator=gen, dtype=torch.int32)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(ops.lora_add_(x, y.clone(), row_slot, slots))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_lora_batch_takes_the_native_path_and_matches_the_torch_one(kernel_level, monkeypatch):
    gen = torch.Generator().manual_seed(3)
    key = (0, "linear")
    layers = [{key: (torch.randn(r, 96, generator=gen) * 0.02,
                     torch.randn(200, r, generator=gen) * 0.02)} for r in (8, 16)]
    x, y = torch.randn(11, 96, generator=gen), torch.randn(11, 200, generator=gen)
    groups = [(layers[0], np.array([0, 3, 4])), (layers[1], np.array([1, 2, 9, 10])),
              ({}, np.array([5]))]
    batch = LoraBatch.build(groups, 11, x.device)
    assert (batch.row_slot is not None) == (kernel_level != "none")
    got = batch.apply(key, x, y.clone())
    monkeypatch.setenv("RADIXSERVE_NATIVE_KERNELS", "0")
    native.reset()
    torch_batch = LoraBatch.build(groups, 11, x.device)
    assert torch_batch.row_slot is None and lora._logged_path[-1] == "torch"
    want = torch_batch.apply(key, x, y.clone())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(got[[5, 6, 7, 8]], y[[5, 6, 7, 8]])
