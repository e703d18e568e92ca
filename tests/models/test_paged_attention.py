"""The paged-attention backends (torch, and the native CPU decode kernel) against a dense
float64 reference, row by row: plain decode rows, rows sharing leading blocks (the torch
cascade path), short chunks run as decode rows, and prefill chunks with and without cached
context; the native kernel's rows do not depend on the rest of the batch, bit for bit."""

from __future__ import annotations

import platform
import re
import shutil
import subprocess

import pytest
import torch

from radixserve.kernels import native
from radixserve.layers.attn_backends.cpu_native import NativeCpuPagedAttention
from radixserve.layers.attn_backends.torch_paged import MIN_SHARED_PREFIX, TorchPagedAttention

BLOCK, HEADS, KV_HEADS, DIM, NUM_BLOCKS = 4, 6, 2, 8, 96
SCALE = DIM ** -0.5


def reference(q, keys, values, lens, window=None, softcap=None):
    """q [T, H, d]; keys/values per row [L_t, KVH, d]; each row attends to its first lens[t]
    (with ``window``: the last ``window`` of them); ``softcap``: cap * tanh(score / cap)."""
    out = []
    group = HEADS // KV_HEADS
    for t in range(q.shape[0]):
        lo = max(0, lens[t] - window) if window else 0
        k = keys[t][lo:lens[t]].double().repeat_interleave(group, dim=1)  # [L, H, d]
        v = values[t][lo:lens[t]].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[t].double(), k) * SCALE
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        out.append(torch.einsum("hl,lhd->hd", scores.softmax(-1), v))
    return torch.stack(out).float()


def q8_rows(x: torch.Tensor) -> torch.Tensor:
    """Float rows [..., d] → an int8 pool's rows [..., d + 4]: round(x * 127 / max|x|), then the
    float32 scale max|x| / 127 as 4 bytes (paged_attention.cpp's int8 layout)."""
    amax = x.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(x * inv).to(torch.int8)
    return torch.cat((q, (amax / 127.0).contiguous().view(torch.int8)), dim=-1)


def q8_values(p: torch.Tensor) -> torch.Tensor:
    return p[..., :-4].float() * p[..., -4:].contiguous().view(torch.float32)


def to_pool(x: torch.Tensor, kv_dtype: torch.dtype) -> torch.Tensor:
    return q8_rows(x) if kv_dtype == torch.int8 else x.to(kv_dtype)


def from_pool(p: torch.Tensor, kv_dtype: torch.dtype) -> torch.Tensor:
    return q8_values(p) if kv_dtype == torch.int8 else p.float()


def run_batch(seqs, seed=0, backend=None, dims=None, kv_dtype=torch.float32, window=None,
              softcap=None):
    """seqs: (block_ids, start_pos, num_new_tokens) packed in this order (decode-like first).
    Returns the backend's output, the reference (on K/V rounded to ``kv_dtype``, the pool's
    elements), and the metadata."""
    gen = torch.Generator().manual_seed(seed)
    k_cache = to_pool(torch.randn(NUM_BLOCKS, BLOCK, KV_HEADS, DIM, generator=gen), kv_dtype)
    v_cache = to_pool(torch.randn(NUM_BLOCKS, BLOCK, KV_HEADS, DIM, generator=gen), kv_dtype)
    total = sum(n for _, _, n in seqs)
    q = torch.randn(total, HEADS, DIM, generator=gen)
    k = torch.randn(total, KV_HEADS, DIM, generator=gen)
    v = torch.randn(total, KV_HEADS, DIM, generator=gen)
    max_blocks = max(len(b) for b, _, _ in seqs)
    table = torch.tensor([b + [0] * (max_blocks - len(b)) for b, _, _ in seqs])
    slots, row_keys, row_values, lens = [], [], [], []
    t = 0
    for (blocks, start, n) in seqs:
        seq_slots = [blocks[p // BLOCK] * BLOCK + p % BLOCK for p in range(start + n)]
        slots += seq_slots[start:]
        # the sequence's K/V as the backend will see it: cached context, then the new rows
        ks = from_pool(k_cache.flatten(0, 1)[seq_slots], kv_dtype)
        vs = from_pool(v_cache.flatten(0, 1)[seq_slots], kv_dtype)
        ks[start:] = from_pool(to_pool(k[t:t + n], kv_dtype), kv_dtype)
        vs[start:] = from_pool(to_pool(v[t:t + n], kv_dtype), kv_dtype)
        for j in range(n):
            row_keys.append(ks)
            row_values.append(vs)
            lens.append(start + j + 1)
        t += n
    backend = backend or TorchPagedAttention()
    meta = backend.build_metadata(
        slot_mapping=torch.tensor(slots), block_table=table,
        context_lens=[s + n for _, s, n in seqs], q_lens=[n for _, _, n in seqs],
        start_pos=[s for _, s, _ in seqs], block_size=BLOCK)
    got = backend.forward(q, k, v, (k_cache, v_cache), meta, SCALE, window, softcap)
    return got, reference(q, row_keys, row_values, lens, window, softcap), meta


SHARED = list(range(1, 1 + MIN_SHARED_PREFIX // BLOCK + 2))  # 18 blocks = 72 shared tokens


@pytest.mark.parametrize("case", ["plain", "shared", "shared_chunks", "short_shared", "prefills"])
def test_backend_matches_dense_reference(case):
    if case == "plain":  # three decodes, no common blocks
        seqs = [([20, 21, 22], 9, 1), ([30, 31], 5, 1), ([40, 41, 42, 43], 15, 1)]
    elif case == "shared":  # a common 72-token prefix, tails of different lengths
        seqs = [(SHARED + [60, 61], 79, 1), (SHARED + [62], 74, 1), (SHARED + [63, 64, 65], 83, 1)]
    elif case == "shared_chunks":  # a short chunk (decode rows) beside a decode, both sharing
        seqs = [(SHARED + [60, 61], 74, 5), (SHARED + [62], 73, 1)]
    elif case == "short_shared":  # common blocks below the threshold: plain path
        seqs = [([1, 2, 60], 9, 1), ([1, 2, 61], 10, 1)]
    else:  # a decode, a fresh prompt, a chunk with cached context
        seqs = [([20, 21], 6, 1), ([30, 31, 32], 0, 10), (SHARED + [62, 63], 70, 10)]
    got, want, meta = run_batch(seqs)
    assert (meta.shared_blocks is not None) == case.startswith("shared")
    if case.startswith("shared"):
        assert meta.shared_blocks.numel() * BLOCK == 72
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_cascade_equals_plain_path_up_to_rounding():
    """The same rows with and without the shared-prefix split agree to float rounding."""
    import radixserve.layers.attn_backends.torch_paged as paged

    seqs = [(SHARED + [60, 61], 79, 1), (SHARED + [62], 74, 1), (SHARED + [63], 75, 1)]
    cascade, _, meta = run_batch(seqs, seed=3)
    assert meta.shared_blocks is not None
    old = paged.MIN_SHARED_PREFIX
    paged.MIN_SHARED_PREFIX = 10 ** 9
    try:
        plain, _, meta = run_batch(seqs, seed=3)
    finally:
        paged.MIN_SHARED_PREFIX = old
    assert meta.shared_blocks is None
    torch.testing.assert_close(cascade, plain, rtol=1e-5, atol=1e-6)


needs_native = pytest.mark.skipif(native.load() is None, reason="native kernels unavailable")
pytestmark = pytest.mark.usefixtures("kernel_level")  # every CPU level built here


@needs_native
@pytest.mark.parametrize("case", ["plain", "shared", "chunks", "prefills", "long"])
def test_native_backend_matches_dense_reference(case):
    if case == "plain":
        seqs = [([20, 21, 22], 9, 1), ([30, 31], 5, 1), ([40, 41, 42, 43], 15, 1)]
    elif case == "shared":
        seqs = [(SHARED + [60, 61], 79, 1), (SHARED + [62], 74, 1), (SHARED + [63, 64, 65], 83, 1)]
    elif case == "chunks":  # a short chunk (decode rows) beside a decode
        seqs = [(SHARED + [60, 61], 74, 5), (SHARED + [62], 73, 1)]
    elif case == "prefills":
        seqs = [([20, 21], 6, 1), ([30, 31, 32], 0, 10), (SHARED + [62, 63], 70, 10)]
    else:  # one row over most of the pool: many 16-token score vectors and a tail
        seqs = [(list(range(1, 91)), 357, 1)]
    got, want, meta = run_batch(seqs, backend=NativeCpuPagedAttention())
    assert meta.row_len.tolist() == [s + j + 1 for _, s, n in seqs for j in range(n)]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@needs_native
@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("case", ["plain", "prefills", "long"])
def test_native_16bit_and_int8_pools_match_dense_reference(case, kv_dtype):
    seqs = {"plain": [([20, 21, 22], 9, 1), ([30, 31], 5, 1), ([40, 41, 42, 43], 15, 1)],
            "prefills": [([20, 21], 6, 1), ([30, 31, 32], 0, 10), (SHARED + [62, 63], 70, 10)],
            "long": [(list(range(1, 91)), 357, 1)]}[case]
    got, want, _ = run_batch(seqs, backend=NativeCpuPagedAttention(), kv_dtype=kv_dtype)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def _store_six_rows(k, v, k_cache, v_cache, gen) -> torch.Tensor:
    """One native forward that stores k/v [6, KV_HEADS, DIM] at slots 5..10; returns them."""
    backend = NativeCpuPagedAttention()
    slots = torch.tensor([5, 6, 7, 8, 9, 10])
    meta = backend.build_metadata(slot_mapping=slots, block_table=torch.tensor([[1, 2, 3]]),
                                  context_lens=[11], q_lens=[6], start_pos=[5], block_size=BLOCK)
    backend.forward(torch.randn(6, HEADS, DIM, generator=gen), k, v, (k_cache, v_cache), meta,
                    SCALE)
    return slots


@needs_native
@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.bfloat16])
def test_native_16bit_pools_store_rows_rounded_as_torch_rounds(kv_dtype):
    k_cache = torch.zeros(NUM_BLOCKS, BLOCK, KV_HEADS, DIM, dtype=kv_dtype)
    v_cache = torch.zeros_like(k_cache)
    gen = torch.Generator().manual_seed(3)
    k = torch.randn(6, KV_HEADS, DIM, generator=gen) * torch.logspace(-9, 5, 6)[:, None, None]
    k[0, 0, :4] = torch.tensor([65519.0, 65520.0, -1e6, 6e-8])  # f16: max, overflow, subnormal
    k[0, 1, :3] = torch.tensor([float("inf"), float("-inf"), float("nan")])
    v = torch.randn(6, KV_HEADS, DIM, generator=gen)
    slots = _store_six_rows(k, v, k_cache, v_cache, gen)
    stored = k_cache.view(-1, KV_HEADS, DIM)[slots]
    want = k.to(kv_dtype)
    assert torch.equal(stored.view(torch.int16)[~want.isnan()],
                       want.view(torch.int16)[~want.isnan()])
    assert stored[want.isnan()].isnan().all()
    assert torch.equal(v_cache.view(-1, KV_HEADS, DIM)[slots], v.to(kv_dtype))


@needs_native
def test_native_int8_pool_stores_rows_with_their_scales():
    """New rows land quantized exactly as ``q8_rows`` (round half to even of x * 127 / max|x|,
    the scale after the values); an all-zero row stores zeros and a zero scale."""
    k_cache = torch.zeros(NUM_BLOCKS, BLOCK, KV_HEADS, DIM + 4, dtype=torch.int8)
    v_cache = torch.zeros_like(k_cache)
    gen = torch.Generator().manual_seed(3)
    k = torch.randn(6, KV_HEADS, DIM, generator=gen) * torch.logspace(-9, 5, 6)[:, None, None]
    k[1, 0] = 0.0
    v = torch.randn(6, KV_HEADS, DIM, generator=gen)
    slots = _store_six_rows(k, v, k_cache, v_cache, gen)
    assert torch.equal(k_cache.flatten(0, 1)[slots], q8_rows(k))
    assert torch.equal(v_cache.flatten(0, 1)[slots], q8_rows(v))
    assert not k_cache.flatten(0, 1)[slots][1, 0].any()


@needs_native
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int8])
def test_native_decode_rows_do_not_depend_on_the_batch(kv_dtype):
    gen = torch.Generator().manual_seed(5)
    pool = (to_pool(torch.randn(NUM_BLOCKS, BLOCK, KV_HEADS, DIM, generator=gen), kv_dtype),
            to_pool(torch.randn(NUM_BLOCKS, BLOCK, KV_HEADS, DIM, generator=gen), kv_dtype))
    seqs = [(SHARED + [60, 61], 79), ([30, 31], 5), (SHARED + [62], 74)]  # (blocks, length)
    q = torch.randn(3, HEADS, DIM, generator=gen)
    k, v = torch.randn(3, KV_HEADS, DIM, generator=gen), torch.randn(3, KV_HEADS, DIM, generator=gen)
    backend = NativeCpuPagedAttention()

    def run(rows):
        width = max(len(seqs[i][0]) for i in rows)
        table = torch.tensor([seqs[i][0] + [0] * (width - len(seqs[i][0])) for i in rows])
        last = [seqs[i][1] - 1 for i in rows]
        slots = torch.tensor([seqs[i][0][p // BLOCK] * BLOCK + p % BLOCK
                              for i, p in zip(rows, last)])
        meta = backend.build_metadata(slot_mapping=slots, block_table=table,
                                      context_lens=[seqs[i][1] for i in rows],
                                      q_lens=[1] * len(rows), start_pos=last, block_size=BLOCK)
        return backend.forward(q[rows], k[rows], v[rows], pool, meta, SCALE)

    together = run([0, 1, 2])
    for i in range(3):
        assert torch.equal(run([i]), together[i:i + 1])
    assert torch.equal(run([2, 0]), together[[2, 0]])
    # enough rows that the kernel works per KV head (few rows: per query head)
    many = run([0, 1, 2, 0, 1, 2, 0, 1])
    assert torch.equal(many[:3], together) and torch.equal(many[3:6], together)


@needs_native
@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.int8])
def test_native_decode_batch_read_block_by_block_for_every_kv_head_keeps_each_rows_bits(kv_dtype):
    """Many decode rows: one work item reads a row's every KV head block by block (its pool
    blocks whole); few: one KV head or one query head a row. A row's bits are the same in each
    way, and the dense result: 24 rows together against each alone, contexts that end inside a
    block, span a chunk boundary (512) or are one token long, the blocks scattered."""
    heads, kv_heads, dim, block, num_blocks = 8, 4, 64, 16, 300
    gen = torch.Generator().manual_seed(23)
    pool = (to_pool(torch.randn(num_blocks, block, kv_heads, dim, generator=gen), kv_dtype),
            to_pool(torch.randn(num_blocks, block, kv_heads, dim, generator=gen), kv_dtype))
    lens = [1, 17, 31, 64, 100, 511, 512, 513, 700] + [40 + 9 * i for i in range(15)]
    order, tables = torch.randperm(num_blocks, generator=gen).tolist(), []
    for n in lens:  # each sequence's own blocks, anywhere in the pool
        tables.append(order[:-(-n // block)])
        order = order[len(tables[-1]):]
    width = max(len(t) for t in tables)
    q = torch.randn(len(lens), heads, dim, generator=gen)
    k = torch.randn(len(lens), kv_heads, dim, generator=gen)
    v = torch.randn(len(lens), kv_heads, dim, generator=gen)
    backend = NativeCpuPagedAttention()

    def run(rows):
        last = [lens[i] - 1 for i in rows]
        slots = torch.tensor([tables[i][p // block] * block + p % block
                              for i, p in zip(rows, last)])
        table = torch.tensor([tables[i] + [0] * (width - len(tables[i])) for i in rows])
        meta = backend.build_metadata(slot_mapping=slots, block_table=table,
                                      context_lens=[lens[i] for i in rows],
                                      q_lens=[1] * len(rows), start_pos=last, block_size=block)
        pools = tuple(p.clone() for p in pool)
        return backend.forward(q[rows], k[rows], v[rows], pools, meta, dim ** -0.5), pools

    together, pools = run(list(range(len(lens))))
    keys, values = (from_pool(p, kv_dtype).view(-1, kv_heads, dim) for p in pools)
    for i, n in enumerate(lens):
        assert torch.equal(run([i])[0], together[i:i + 1]), n
        slots = [tables[i][p // block] * block + p % block for p in range(n)]
        torch.testing.assert_close(together[i], dense_row(q[i], keys[slots], values[slots]),
                                   rtol=1e-4, atol=1e-5)
    assert torch.equal(run(list(range(0, len(lens), 2)))[0], together[::2])


@needs_native
def test_native_rows_are_the_same_in_one_chunk_or_several():
    """A 10-token prompt prefilled at once, in chunks of 6 + 4, or token by token: every
    row's output is the same bits (the cached context is read back from the pool)."""
    gen = torch.Generator().manual_seed(7)
    blocks = [5, 9, 2]
    q = torch.randn(10, HEADS, DIM, generator=gen)
    k, v = torch.randn(10, KV_HEADS, DIM, generator=gen), torch.randn(10, KV_HEADS, DIM, generator=gen)
    backend = NativeCpuPagedAttention()

    def run(pieces):
        pool = (torch.zeros(NUM_BLOCKS, BLOCK, KV_HEADS, DIM),
                torch.zeros(NUM_BLOCKS, BLOCK, KV_HEADS, DIM))
        outs = []
        for start, n in pieces:
            rows = slice(start, start + n)
            slots = torch.tensor([blocks[p // BLOCK] * BLOCK + p % BLOCK
                                  for p in range(start, start + n)])
            meta = backend.build_metadata(slot_mapping=slots, block_table=torch.tensor([blocks]),
                                          context_lens=[start + n], q_lens=[n],
                                          start_pos=[start], block_size=BLOCK)
            outs.append(backend.forward(q[rows], k[rows], v[rows], pool, meta, SCALE))
        return torch.cat(outs)

    whole = run([(0, 10)])
    assert torch.equal(run([(0, 6), (6, 4)]), whole)
    assert torch.equal(run([(i, 1) for i in range(10)]), whole)


@needs_native
@pytest.mark.parametrize(("heads", "kv_heads", "dim", "block"), [(9, 3, 64, 16), (8, 4, 128, 16),
                                                                  (4, 1, 64, 5), (6, 6, 48, 16)])
def test_native_kernel_specialised_shapes_match_dense(heads, kv_heads, dim, block):
    """The compiled-in (group, head_dim) variants and the generic one, odd block sizes and
    rows that end inside a 16-token vector."""
    gen = torch.Generator().manual_seed(heads * dim)
    num_blocks = 40
    pool = (torch.randn(num_blocks, block, kv_heads, dim, generator=gen),
            torch.randn(num_blocks, block, kv_heads, dim, generator=gen))
    blocks = torch.randperm(num_blocks, generator=gen)[:30].tolist()
    lens = [1, 15, 16, 17, 33, 100, 30 * block]
    q = torch.randn(len(lens), heads, dim, generator=gen)
    slots = [blocks[p // block] * block + p % block for p in range(30 * block)]
    keys = pool[0].view(-1, kv_heads, dim)[slots].clone()
    values = pool[1].view(-1, kv_heads, dim)[slots].clone()
    # each row's own (last) token is "new": it rewrites its slot with the value already there
    last = torch.tensor([n - 1 for n in lens])
    backend = NativeCpuPagedAttention()
    meta = backend.build_metadata(slot_mapping=torch.tensor(slots)[last],
                                  block_table=torch.tensor([blocks] * len(lens)),
                                  context_lens=lens, q_lens=[1] * len(lens),
                                  start_pos=[n - 1 for n in lens], block_size=block)
    got = backend.forward(q, keys[last], values[last], pool, meta, dim ** -0.5)
    for i, n in enumerate(lens):
        torch.testing.assert_close(got[i], dense_row(q[i], keys[:n], values[:n]),
                                   rtol=1e-4, atol=1e-5)


def dense_row(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """One row's attention in float64: q [H, d] over keys/values [L, KVH, d] (grouped heads)."""
    group = q.shape[0] // keys.shape[1]
    k = keys.double().repeat_interleave(group, dim=1)
    v = values.double().repeat_interleave(group, dim=1)
    p = (torch.einsum("hd,lhd->hl", q.double(), k) * q.shape[-1] ** -0.5).softmax(-1)
    return torch.einsum("hl,lhd->hd", p, v).float()


@needs_native
def test_native_long_contexts_in_chunks_match_dense_and_do_not_depend_on_the_batch():
    """Contexts over 512 tokens are attended in 512-token chunks merged in order (balance at
    batch 1): still the dense result, and still a row's own bits alone or in any batch (the
    chunks depend only on the row's length; one chunk or less is computed as before)."""
    heads, kv_heads, dim, block, num_blocks = 9, 3, 64, 16, 100
    gen = torch.Generator().manual_seed(11)
    pool = (torch.randn(num_blocks, block, kv_heads, dim, generator=gen),
            torch.randn(num_blocks, block, kv_heads, dim, generator=gen))
    blocks = torch.randperm(num_blocks, generator=gen)[:80].tolist()
    lens = [1100, 513, 512, 1024, 40]
    q = torch.randn(len(lens), heads, dim, generator=gen)
    slots = [blocks[p // block] * block + p % block for p in range(80 * block)]
    keys = pool[0].view(-1, kv_heads, dim)[slots].clone()
    values = pool[1].view(-1, kv_heads, dim)[slots].clone()
    backend = NativeCpuPagedAttention()

    def run(rows):
        last = torch.tensor([lens[i] - 1 for i in rows])
        meta = backend.build_metadata(slot_mapping=torch.tensor(slots)[last],
                                      block_table=torch.tensor([blocks] * len(rows)),
                                      context_lens=[lens[i] for i in rows],
                                      q_lens=[1] * len(rows), start_pos=last.tolist(),
                                      block_size=block)
        return backend.forward(q[rows], keys[last], values[last], pool, meta, dim ** -0.5)

    together = run(list(range(len(lens))))
    for i, n in enumerate(lens):
        torch.testing.assert_close(together[i], dense_row(q[i], keys[:n], values[:n]),
                                   rtol=1e-4, atol=1e-5)
        assert torch.equal(run([i]), together[i:i + 1])  # alone: per query head or grouped
    assert torch.equal(run([3, 0]), together[[3, 0]])


# -- sliding windows and soft-capped scores ---------------------------------------------------

WINDOW_CASES = {
    "decodes": [([20, 21, 22], 9, 1), ([30, 31], 5, 1), ([40, 41, 42, 43], 15, 1)],
    "shared": [(SHARED + [60, 61], 79, 1), (SHARED + [62], 74, 1), (SHARED + [63, 64], 78, 1)],
    "chunks": [(SHARED + [60, 61], 74, 5), (SHARED + [62], 73, 1)],
    "prefills": [([20, 21], 6, 1), ([30, 31, 32, 33], 0, 14), (SHARED + [62, 63], 70, 10)],
}


@pytest.mark.parametrize("backend_cls", [TorchPagedAttention, NativeCpuPagedAttention],
                         ids=["torch", "native"])
@pytest.mark.parametrize("window,softcap", [(6, None), (8, None), (1, None), (None, 2.0),
                                            (5, 2.0)])
@pytest.mark.parametrize("case", sorted(WINDOW_CASES))
def test_windowed_and_softcapped_rows_match_dense_reference(case, window, softcap,
                                                            backend_cls):
    """Query at p sees keys p - window < j <= p (transformers' sliding mask): windows that
    start inside a block (6, block 4), on its edge (8), only the row itself (1); decode rows
    beside a shared prefix (the torch cascade is bypassed), short chunks, fresh prompts and
    chunks with cached context; soft-capped scores alone and with a window."""
    if backend_cls is NativeCpuPagedAttention and native.load() is None:
        pytest.skip("native kernels unavailable")
    got, want, _ = run_batch(WINDOW_CASES[case], backend=backend_cls(), window=window,
                             softcap=softcap)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@needs_native
@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.int8])
def test_native_window_on_16bit_and_int8_pools(kv_dtype):
    got, want, _ = run_batch(WINDOW_CASES["prefills"], backend=NativeCpuPagedAttention(),
                             kv_dtype=kv_dtype, window=7, softcap=3.0)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@needs_native
@pytest.mark.parametrize("window", [600, 512, 100])
def test_native_long_rows_with_a_window_in_chunks_match_dense_and_the_batch(window):
    """Windows over 512 tokens are attended in 512-token chunks from the window's first key
    (not block aligned): the dense result, the same bits alone or in any batch, and a row
    whose window covers it all equals the unwindowed row bit for bit."""
    heads, kv_heads, dim, block, num_blocks = 8, 4, 64, 16, 100
    gen = torch.Generator().manual_seed(13)
    pool = (torch.randn(num_blocks, block, kv_heads, dim, generator=gen),
            torch.randn(num_blocks, block, kv_heads, dim, generator=gen))
    blocks = torch.randperm(num_blocks, generator=gen)[:80].tolist()
    lens = [1100, 601, 513, 100, 7]
    q = torch.randn(len(lens), heads, dim, generator=gen)
    slots = [blocks[p // block] * block + p % block for p in range(80 * block)]
    keys = pool[0].view(-1, kv_heads, dim)[slots].clone()
    values = pool[1].view(-1, kv_heads, dim)[slots].clone()
    backend = NativeCpuPagedAttention()

    def run(rows, w):
        last = torch.tensor([lens[i] - 1 for i in rows])
        meta = backend.build_metadata(slot_mapping=torch.tensor(slots)[last],
                                      block_table=torch.tensor([blocks] * len(rows)),
                                      context_lens=[lens[i] for i in rows],
                                      q_lens=[1] * len(rows), start_pos=last.tolist(),
                                      block_size=block)
        return backend.forward(q[rows], keys[last], values[last], pool, meta, dim ** -0.5, w)

    together = run(list(range(len(lens))), window)
    full = run(list(range(len(lens))), None)
    for i, n in enumerate(lens):
        lo = max(0, n - window)
        torch.testing.assert_close(together[i], dense_row(q[i], keys[lo:n], values[lo:n]),
                                   rtol=1e-4, atol=1e-5)
        assert torch.equal(run([i], window), together[i:i + 1])
        if n <= window:
            assert torch.equal(together[i], full[i])
    assert torch.equal(run([3, 0], window), together[[3, 0]])


# -- a prompt's rows in tiles -----------------------------------------------------------------

@needs_native
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16, torch.int8])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 128), (6, 6, 48)])
def test_native_prompt_rows_in_tiles_equal_each_row_alone(heads, kv_heads, dim, kv_dtype):
    """A 600-token prompt's rows share each K / V load in tiles of up to 32 rows of the
    sequence: every row is the same bits as that row attended alone (a decode row), whether the
    prompt runs in one step or in uneven chunks over its cached part, across the 512-token
    context chunk; and close to the dense result."""
    block, num_blocks, n = 16, 48, 600
    gen = torch.Generator().manual_seed(heads * dim)
    blocks = torch.randperm(num_blocks, generator=gen)[:-(-n // block)].tolist()
    q = torch.randn(n, heads, dim, generator=gen)
    k, v = torch.randn(n, kv_heads, dim, generator=gen), torch.randn(n, kv_heads, dim, generator=gen)
    backend = NativeCpuPagedAttention()
    pool = (to_pool(torch.zeros(num_blocks, block, kv_heads, dim), kv_dtype),
            to_pool(torch.zeros(num_blocks, block, kv_heads, dim), kv_dtype))

    def run(start, count):
        rows = slice(start, start + count)
        slots = torch.tensor([blocks[p // block] * block + p % block
                              for p in range(start, start + count)])
        meta = backend.build_metadata(slot_mapping=slots, block_table=torch.tensor([blocks]),
                                      context_lens=[start + count], q_lens=[count],
                                      start_pos=[start], block_size=block)
        return backend.forward(q[rows], k[rows], v[rows], pool, meta, dim ** -0.5)

    whole = run(0, n)
    assert torch.equal(torch.cat([run(s, c) for s, c in ((0, 5), (5, 290), (295, 218),
                                                         (513, 87))]), whole)
    keys = from_pool(to_pool(k, kv_dtype), kv_dtype)
    values = from_pool(to_pool(v, kv_dtype), kv_dtype)
    for p in [0, 1, 15, 16, 17, 100, 255, 510, 511, 512, 513, 530, 599]:
        assert torch.equal(run(p, 1), whole[p:p + 1]), p
        torch.testing.assert_close(whole[p], dense_row(q[p], keys[:p + 1], values[:p + 1]),
                                   rtol=1e-4, atol=1e-5)


def test_each_attend_of_the_loaded_library_asks_for_the_next_pool_block():
    """The next block's prefetches survive the compiler: GCC 12 once dropped every call to the
    helper as having no effect, and nothing else shows it (the results are the same)."""
    objdump = shutil.which("objdump")
    if native.load() is None or objdump is None:
        pytest.skip("needs this level's kernel library and objdump")
    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", "-C", native.describe().path],
                          capture_output=True, text=True, check=True).stdout
    attends = [body for body in re.split(r"\n(?=[0-9a-f]+ <)", text)
               if re.match(r"[0-9a-f]+ <void \(anonymous namespace\)::attend<", body)]
    opcode = "prfm" if platform.machine().lower() in ("aarch64", "arm64") else "prefetch"
    assert attends and all(opcode in body for body in attends)
