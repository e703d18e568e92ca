"""BlockPool: owns the KV block ids, their reference counts and the free list."""

from __future__ import annotations

from collections import deque


class BlockPool:
    """Fixed set of block ids ``0..num_blocks-1``.

    A block is *free* (ref count 0, in the free queue) or *used* (ref count >= 1). ``allocate``
    pops from the front of the free queue; ``free`` appends released blocks at the back, so a
    just-freed block is reused last (helps tests pin exact ids).

    ``with_null_block``: the last id is reserved as the *null block* (ref count 1 forever,
    never allocated): the slot of a block table whose page a sliding-window layer released
    (kv_groups.py). Nothing is ever written to it, and attention never reads it (it is out
    of every query's window). The other ids keep the order they have without it.
    """

    def __init__(self, num_blocks: int, with_null_block: bool = False) -> None:
        if num_blocks < 1 + with_null_block:
            raise ValueError(f"num_blocks must be >= {1 + with_null_block}, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self.free_queue: deque[int] = deque(range(num_blocks))
        self.null_block: int | None = None
        if with_null_block:
            self.null_block = self.free_queue.pop()
            self.ref_counts[self.null_block] = 1

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free_queue) / self.num_blocks

    def allocate(self, num: int) -> list[int]:
        """Take ``num`` free blocks (ref count 1 each). Caller checks ``num_free_blocks`` first."""
        assert num <= len(self.free_queue), f"allocate({num}) with {len(self.free_queue)} free"
        blocks = [self.free_queue.popleft() for _ in range(num)]
        for b in blocks:
            self.ref_counts[b] = 1
        return blocks

    def share(self, block_ids: list[int]) -> None:
        """Add one reference to each used block (a fork shares its parent's blocks)."""
        for b in block_ids:
            assert self.ref_counts[b] > 0, f"share of free block {b}"
            assert b != self.null_block, "share of the null block"
            self.ref_counts[b] += 1

    def free(self, block_ids: list[int]) -> None:
        """Drop one reference from each block; blocks reaching 0 go back to the free queue.
        NOTE: never the null block (callers skip it: it is not owned)."""
        for b in block_ids:
            assert self.ref_counts[b] > 0, f"double free of block {b}"
            assert b != self.null_block, "free of the null block"
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_queue.append(b)

    def check_integrity(self) -> None:
        free = set(self.free_queue)
        assert len(free) == len(self.free_queue), "a block is twice in the free queue"
        for b, rc in enumerate(self.ref_counts):
            assert rc >= 0, f"negative ref count on block {b}"
            assert (rc == 0) == (b in free), f"block {b}: ref count {rc}, free={b in free}"
        if self.null_block is not None:
            assert self.ref_counts[self.null_block] == 1, "the null block's ref count moved"
