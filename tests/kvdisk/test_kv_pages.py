"""The pool's pages as bytes (runner/kv_pages.py): out and back in exactly, other blocks
untouched, an MLA pool's single plane once; on the CPU's numpy path and on the torch path
that other devices take (run here on the CPU)."""

from __future__ import annotations

import pytest
import torch

from radixserve.runner.kv_pages import KVPages


def pool(num_layers=3, blocks=10, dtype=torch.float16, shared=False):
    torch.manual_seed(0)
    out = []
    for _ in range(num_layers):
        k = torch.randn(blocks, 4, 2, 8).to(dtype)
        out.append((k, k if shared else torch.randn(blocks, 4, 2, 8).to(dtype)))
    return out


@pytest.mark.parametrize("torch_path", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_pages_round_trip(torch_path, dtype):
    kv = pool(dtype=dtype)
    pages = KVPages(kv)
    if torch_path:
        pages._on_cpu = False
    assert pages.page_bytes == 3 * 2 * 4 * 2 * 8 * torch.tensor([], dtype=dtype).element_size()
    data = pages.copy_out([7, 2, 5])
    assert data.shape == (3, pages.page_bytes)
    before = [t.clone() for pair in kv for t in pair]
    pages.copy_in([1, 3, 4], data)
    for b, t in zip(before, (t for pair in kv for t in pair)):
        assert torch.equal(t[[1, 3, 4]], b[[7, 2, 5]])
        keep = [0, 2, 5, 6, 7, 8, 9]
        assert torch.equal(t[keep], b[keep])


def test_a_shared_plane_is_stored_once():
    kv = pool(shared=True)
    pages = KVPages(kv)
    assert len(pages.planes) == 3
    data = pages.copy_out([0])
    for k, _ in kv:
        k.zero_()
    pages.copy_in([0], data)
    assert torch.equal(kv[0][0][0], pool(shared=True)[0][0][0])
