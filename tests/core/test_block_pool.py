from __future__ import annotations

import pytest

from radixserve.core.kv.block_pool import BlockPool


def test_allocate_free_order_and_refcounts():
    pool = BlockPool(4)
    a = pool.allocate(2)
    assert a == [0, 1]
    assert pool.num_free_blocks == 2
    pool.share([1])
    pool.free([0, 1])
    assert pool.ref_counts == [0, 1, 0, 0]
    assert list(pool.free_queue) == [2, 3, 0]
    pool.free([1])
    assert list(pool.free_queue) == [2, 3, 0, 1]
    assert pool.allocate(3) == [2, 3, 0]
    pool.check_integrity()


def test_double_free_is_caught():
    pool = BlockPool(2)
    b = pool.allocate(1)
    pool.free(b)
    with pytest.raises(AssertionError):
        pool.free(b)


def test_bad_size():
    with pytest.raises(ValueError):
        BlockPool(0)
