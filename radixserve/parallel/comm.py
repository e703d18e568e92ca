"""How tensor-parallel ranks sum their partial outputs and get each step's input:
``--tp-all-reduce auto | shm | torch``.

Both backends have one interface: ``all_reduce(t)`` (sum in place over the ranks, the same
bits on every rank, returns ``t``), ``send_step(int64 array)`` on rank 0 and ``recv_step()``
on the others (one message per step), ``num_calls`` / ``seconds`` (all-reduce time, for
benchmarks) and ``close()``.

- ``shm`` (shm_comm.py): one shared-memory segment and a flag barrier; one machine, x86-64.
- ``torch``: ``torch.distributed`` over the process group the ranks joined (gloo on CPU).

``auto`` is ``shm`` on x86-64 CPUs, ``torch`` elsewhere: measured (benchmarks/bench_tp.py,
docs/scale-out.md; 2 ranks on a loaded 2-vCPU machine) 6 µs against gloo's 3.3 ms for a
decode step's 2 KB, 8 µs against 3.7 ms at 36 KB, 1–2 ms against 6–13 ms at 4.6 MB.
"""

from __future__ import annotations

import logging
import platform
import time

import numpy as np
import torch

from radixserve.config import TP_ALL_REDUCES
from radixserve.parallel.shm_comm import RankLost

logger = logging.getLogger(__name__)


def resolve_all_reduce(name: str) -> str:
    """``name`` → "shm" or "torch"; ValueError naming the supported ones."""
    if name not in TP_ALL_REDUCES:
        raise ValueError(f"unknown tensor-parallel all-reduce {name!r}; supported: "
                         f"{', '.join(TP_ALL_REDUCES)}")
    if name != "auto":
        return name
    return "shm" if platform.machine() in ("x86_64", "AMD64") else "torch"


def describe_all_reduce(name: str) -> str:
    """One line for ``radixserve env`` and the start-up log."""
    if name == "shm":
        return "shm (a shared-memory segment with a flag barrier, one machine)"
    return "torch.distributed all_reduce (gloo on CPU)"


class TorchComm:
    """The ranks' default ``torch.distributed`` process group (gloo); a failed collective
    means a rank is gone (`RankLost`)."""

    name = "torch"

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.num_calls = 0
        self.seconds = 0.0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        start = time.perf_counter()
        try:
            dist.all_reduce(x)
        except RuntimeError as exc:
            raise RankLost(f"tensor-parallel rank {self.rank}: all_reduce failed: {exc}") from exc
        self.num_calls += 1
        self.seconds += time.perf_counter() - start
        return x

    def send_step(self, message: np.ndarray) -> None:
        self._broadcast(torch.from_numpy(np.array([message.size], np.int64)))
        self._broadcast(torch.from_numpy(message))

    def recv_step(self) -> np.ndarray:
        size = torch.zeros(1, dtype=torch.int64)
        self._broadcast(size)
        message = torch.empty(int(size[0]), dtype=torch.int64)
        self._broadcast(message)
        return message.numpy()

    def _broadcast(self, t: torch.Tensor) -> None:
        import torch.distributed as dist

        try:
            dist.broadcast(t, src=0)
        except RuntimeError as exc:
            raise RankLost(f"tensor-parallel rank {self.rank}: broadcast failed: {exc}") from exc

    def close(self) -> None:
        pass
