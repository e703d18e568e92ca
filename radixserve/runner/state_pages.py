"""A hybrid model's recurrent-state slots as bytes, for the disk tier (kvdisk/tier.py).

A slot's payload is every recurrent layer's conv window, then (where the layout has one) every
layer's recurrent matrix, in layer order: the raw bytes of ``StateTensors``' rows (the conv in
the model's element type, the matrix float32). On the CPU the rows are moved as numpy byte
views, as runner/kv_pages.py moves KV pages; elsewhere through host memory.
"""

from __future__ import annotations

import numpy as np
import torch

from radixserve.runner.recurrent_state import StateTensors


class StatePages:
    """Over the runner's ``StateTensors``. Call between steps only."""

    def __init__(self, states: StateTensors) -> None:
        self.planes = [*states.conv.values(), *states.ssm.values()]
        self.plane_bytes = [t[0].numel() * t.element_size() for t in self.planes]
        self.slot_bytes = sum(self.plane_bytes)
        self._on_cpu = self.planes[0].device.type == "cpu"
        self._views = ([t.view(t.shape[0], -1).view(torch.uint8).numpy() for t in self.planes]
                       if self._on_cpu else [])

    def copy_out(self, slot: int) -> np.ndarray:
        """``[slot_bytes]`` uint8: a copy of ``slot`` (the pool may reuse it at once)."""
        out = np.empty(self.slot_bytes, np.uint8)
        off = 0
        for i, size in enumerate(self.plane_bytes):
            if self._on_cpu:
                out[off:off + size] = self._views[i][slot]
            else:
                out[off:off + size] = self.planes[i][slot].reshape(-1).view(torch.uint8).cpu()
            off += size
        return out

    def copy_in(self, slot: int, data: np.ndarray | memoryview) -> None:
        """Write ``data`` (``slot_bytes`` bytes, from `copy_out`) into ``slot``."""
        data = np.frombuffer(data, np.uint8) if isinstance(data, memoryview) else data
        assert data.shape == (self.slot_bytes,), data.shape
        off = 0
        for i, (t, size) in enumerate(zip(self.planes, self.plane_bytes)):
            if self._on_cpu:
                self._views[i][slot] = data[off:off + size]
            else:
                row = torch.from_numpy(data[off:off + size].copy()).to(t.device)
                t[slot].copy_(row.view(t.dtype).view(t.shape[1:]))
            off += size
