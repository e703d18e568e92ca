"""Whole pages of the paged KV pool as bytes, for the disk tier (kvdisk/tier.py).

A page's payload is every layer's K rows then V rows of one block, each plane's block
``[block_size, num_kv_heads, row_width]`` as raw bytes of the pool's element type (an MLA
model's single latent plane once: its V is its K). On the CPU the planes are moved as numpy
byte views: torch's uint8 copies of strided slices measured 30x slower (255 pages of 360 KiB
into the pool: 1.7 s against 0.02-0.06 s; out of it 0.8 s against 0.06 s, a busy 2-core
Xeon). Elsewhere torch gathers / scatters through host memory.
"""

from __future__ import annotations

import numpy as np
import torch


class KVPages:
    """Over the runner's ``kv_caches`` (per layer ``(k, v)``, one KV group: each layer its
    own tensors ``[num_blocks, block_size, heads, width]``). Call between steps only."""

    def __init__(self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        planes = []
        for k, v in kv_caches:
            planes.append(k)
            if not v.is_set_to(k):  # MLA: V is K's tensor (one plane)
                planes.append(v)
        self.planes = planes
        self.plane_bytes = [t[0].numel() * t.element_size() for t in planes]
        self.page_bytes = sum(self.plane_bytes)
        self._on_cpu = planes[0].device.type == "cpu"
        # [num_blocks, plane_bytes] byte views of the pool (CPU): writes go to the pool
        self._views = ([t.view(t.shape[0], -1).view(torch.uint8).numpy() for t in planes]
                       if self._on_cpu else [])

    def copy_out(self, block_ids: list[int]) -> np.ndarray:
        """``[len(block_ids), page_bytes]`` uint8: a copy of those pages (the pool may reuse
        the blocks as soon as this returns)."""
        out = np.empty((len(block_ids), self.page_bytes), np.uint8)
        if self._on_cpu:
            idx = np.asarray(block_ids)
            off = 0
            for view, size in zip(self._views, self.plane_bytes):
                out[:, off:off + size] = view[idx]
                off += size
            return out
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.planes[0].device)
        parts = [t.index_select(0, idx).reshape(len(block_ids), -1).view(torch.uint8)
                 for t in self.planes]
        out[:] = torch.cat(parts, dim=1).cpu().numpy()
        return out

    def copy_in(self, block_ids: list[int], pages: np.ndarray) -> None:
        """Write ``pages`` (``[len(block_ids), page_bytes]`` uint8) into those blocks."""
        assert pages.shape == (len(block_ids), self.page_bytes), pages.shape
        if self._on_cpu:
            idx = np.asarray(block_ids)
            off = 0
            for view, size in zip(self._views, self.plane_bytes):
                view[idx] = pages[:, off:off + size]
                off += size
            return
        device = self.planes[0].device
        idx = torch.tensor(block_ids, dtype=torch.long, device=device)
        data = torch.from_numpy(pages).to(device)
        off = 0
        for t, size in zip(self.planes, self.plane_bytes):
            rows = data[:, off:off + size].contiguous().view(t.dtype)
            t.index_copy_(0, idx, rows.view(len(block_ids), *t.shape[1:]))
            off += size
