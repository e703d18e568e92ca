"""The recurrent-state pool of a hybrid model (Gated DeltaNet / Mamba layers beside attention).

A recurrent layer keeps, per sequence, a fixed-size state instead of KV that grows with it: a
causal conv window and a recurrent matrix per head. The runner holds every such layer's states
in tensors with one row per *slot* (runner/recurrent_state.py); this pool hands the slots out,
as the block pool hands out KV blocks. A slot is either a running request's live state, the
snapshot a request keeps of its state at its last page boundary, or a snapshot the prefix
cache keeps on a radix node (core/kv/radix_snapshots.py). Torch-free.
"""

from __future__ import annotations


class StatePool:
    """``num_slots`` slots, each free or held by exactly one owner."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"a state pool needs at least one slot, got {num_slots}")
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))  # pop() hands out 0, 1, 2 ... first
        self._held = [False] * num_slots

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int | None:
        """A free slot (its content is stale: the runner zeroes or overwrites it), or None."""
        if not self._free:
            return None
        slot = self._free.pop()
        self._held[slot] = True
        return slot

    def free(self, slot: int) -> None:
        assert self._held[slot], f"state slot {slot} freed twice"
        self._held[slot] = False
        self._free.append(slot)

    def check_integrity(self, held: int) -> None:
        """Assert that ``held`` slots are out (the owners' count)."""
        assert self.num_slots - len(self._free) == held, (
            f"{self.num_slots - len(self._free)} state slots out, owners hold {held}")
        assert len(set(self._free)) == len(self._free)
