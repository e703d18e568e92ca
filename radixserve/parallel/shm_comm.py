"""Shared-memory all-reduce and step broadcast for the tensor-parallel ranks of one machine.

One file in /dev/shm, mapped by every rank (rank 0 creates it and unlinks it once all have
mapped it, so a crash leaves nothing behind):

    flags    int64 [world]                     all-reduces rank r has posted
    acks     int64 [world]                     step messages rank r has read
    step     int64 [2]                         messages sent, the last one's length in bytes
    slots    float32 [2, world, slot_elems]    double buffered by call parity
    message  uint8 [message_bytes]

all_reduce(x), the c-th call (every rank makes the same calls in the same order):
    1. copy x into slots[c % 2, rank]; flags[rank] = c
    2. wait until flags[r] >= c for every r
    3. x = slots[c % 2, 0] + slots[c % 2, 1] + ...   (rank order: every rank gets the same bits)
One barrier is enough: a rank at call c + 1 overwrites buffer (c + 1) % 2, last read in call
c - 1, and every rank finished reading that before posting call c, which it has waited for.
A tensor larger than a slot goes through in slot-sized pieces, one call each.

NOTE: the flag protocol relies on x86-64's store order (a rank's data stores are seen before
its flag store, plain loads are not reordered with each other); elsewhere ``auto`` picks the
torch.distributed all-reduce (comm.py).

Waiting spins briefly (the ranks do the same work, so a barrier is usually met within
microseconds), then yields the CPU, then sleeps in growing naps (an idle engine's ranks wait
for the next step at ~1 % of a core), and checks every half second that the other ranks are
alive: `RankLost` when one is not.
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Callable

import numpy as np
import torch

_SPIN_S = 50e-6
_YIELD_S = 2e-3
_MAX_NAP_S = 1e-3
_LIVENESS_S = 0.5


class RankLost(BaseException):
    """Another tensor-parallel rank is gone: the engine cannot go on (a BaseException, so the
    engine's per-step error handling does not catch it and the engine process ends)."""


class ShmComm:
    """Rank ``rank`` of ``world`` on the mapping of ``path``; ``alive()`` is False once another
    rank is known to be gone."""

    name = "shm"

    def __init__(self, path: str, rank: int, world: int, slot_elems: int, message_bytes: int,
                 alive: Callable[[], bool]) -> None:
        self.rank, self.world, self.slot_elems = rank, world, slot_elems
        self._alive = alive
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, segment_bytes(world, slot_elems, message_bytes))
        finally:
            os.close(fd)
        buf = np.frombuffer(self._map, np.uint8)
        ints = buf[:8 * (2 * world + 2)].view(np.int64)
        self._flags, self._acks, self._step = ints[:world], ints[world:2 * world], ints[2 * world:]
        start = 8 * (2 * world + 2)
        slot_bytes = 4 * 2 * world * slot_elems
        self._slots = buf[start:start + slot_bytes].view(np.float32).reshape(2, world, slot_elems)
        self._message = buf[start + slot_bytes:]
        self._calls = 0
        self._seen = 0
        self.num_calls = 0  # all-reduce calls and the seconds spent in them (benchmarks)
        self.seconds = 0.0

    @staticmethod
    def create(folder: str, world: int, slot_elems: int, message_bytes: int) -> str:
        """A zeroed segment file for ``world`` ranks; returns its path (rank 0 unlinks it once
        every rank has mapped it)."""
        fd, path = _mkstemp(folder)
        try:
            os.ftruncate(fd, segment_bytes(world, slot_elems, message_bytes))
        finally:
            os.close(fd)
        return path

    # -- all-reduce ------------------------------------------------------------------------

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum the contiguous CPU tensor ``x`` over the ranks, in place (float32 exactly;
        other dtypes summed in float32); returns ``x``."""
        start = time.perf_counter()
        flat = x.view(-1)
        for lo in range(0, flat.numel(), self.slot_elems):
            self._reduce_piece(flat[lo:lo + self.slot_elems])
        self.num_calls += 1
        self.seconds += time.perf_counter() - start
        return x

    def _reduce_piece(self, piece: torch.Tensor) -> None:
        self._calls += 1
        n, c = piece.numel(), self._calls
        slots = self._slots[c % 2]
        is_f32 = piece.dtype == torch.float32
        if is_f32:
            src = piece.numpy()
            np.copyto(slots[self.rank, :n], src)
        else:
            torch.from_numpy(slots[self.rank, :n]).copy_(piece)
        self._flags[self.rank] = c
        flags = self._flags
        self._wait(lambda: int(flags.min()) >= c)
        out = piece.numpy() if is_f32 else np.empty(n, np.float32)
        np.add(slots[0, :n], slots[1, :n], out=out)
        for r in range(2, self.world):
            np.add(out, slots[r, :n], out=out)
        if not is_f32:
            piece.copy_(torch.from_numpy(out))

    # -- step messages (rank 0 → the others) -----------------------------------------------

    def send_step(self, message: np.ndarray) -> None:
        """Rank 0: publish ``message`` (int64) once every rank has read the previous one."""
        data = message.view(np.uint8)
        assert data.size <= self._message.size, "a step message larger than its buffer"
        sent, acks = int(self._step[0]), self._acks
        self._wait(lambda: int(acks[1:].min()) >= sent)
        self._message[:data.size] = data
        self._step[1] = data.size
        self._step[0] = sent + 1

    def recv_step(self) -> np.ndarray:
        """Ranks > 0: the next message rank 0 sends (waits for it; a copy)."""
        step, seen = self._step, self._seen
        self._wait(lambda: int(step[0]) > seen)
        message = self._message[:int(self._step[1])].copy().view(np.int64)
        self._seen += 1
        self._acks[self.rank] = self._seen
        return message

    # -- waiting ---------------------------------------------------------------------------

    def _wait(self, done: Callable[[], bool]) -> None:
        if done():
            return
        start = last_check = time.perf_counter()
        nap = 1e-5
        while not done():
            now = time.perf_counter()
            if now - start < _SPIN_S:
                continue
            if now - start < _YIELD_S:
                os.sched_yield()
            else:
                time.sleep(nap)
                nap = min(2 * nap, _MAX_NAP_S)
            if now - last_check > _LIVENESS_S:
                last_check = now
                if not self._alive():
                    raise RankLost(f"tensor-parallel rank {self.rank}: another rank is gone")

    def close(self) -> None:
        self._flags = self._acks = self._step = self._slots = self._message = None
        try:
            self._map.close()
        except BufferError:  # a numpy view still held somewhere: the mapping goes with it
            pass


def segment_bytes(world: int, slot_elems: int, message_bytes: int) -> int:
    return 8 * (2 * world + 2) + 4 * 2 * world * slot_elems + message_bytes


def _mkstemp(folder: str) -> tuple[int, str]:
    import tempfile

    return tempfile.mkstemp(prefix="radixserve-tp-", dir=folder)
