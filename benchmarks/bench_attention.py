"""The native paged attention (paged_attention.cpp) at real shapes, per CPU level: a whole
prompt prefilled in one step (every row of one sequence, causal) and a batch of decode rows at
a long context, its pool blocks adjacent (a fresh server) and scattered (a pool whose blocks were
taken and freed in other orders for a while), over a float16 pool (``--kv-cache-dtype auto``) of random K/V. Prints ms per
layer call and GMAC/s of useful multiply-adds (q.k and p.v: 2 * H * d per context token per
row), beside torch's own CPU attention (``scaled_dot_product_attention``, causal, float32,
dense K/V already gathered: no pool reads) on the same rows in the same run.

    .venv/bin/python benchmarks/bench_attention.py [--levels avx512,avx2] [--shapes 3b,8b]
        [--prompt 2048] [--decode 16x2048] [--kv float16] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from radixserve.kernels import native, ops
from radixserve.layers.attn_backends.cpu_native import NativeCpuPagedAttention

SHAPES = {  # heads, kv heads, head dim
    "1b": (32, 8, 64),  # Llama-3.2-1B
    "3b": (24, 8, 128),  # Llama-3.2-3B
    "8b": (32, 8, 128),  # Llama-3.1-8B, Qwen2.5-7B (28 / 4)
}
BLOCK = 16


def _case(shape, seqs: list[tuple[int, int]], kv_dtype: torch.dtype, scattered: bool = False):
    """seqs: (cached tokens, new rows) per sequence → (q, k, v, pools, meta); each sequence's
    blocks one after another in the pool, or with ``scattered`` anywhere in it."""
    heads, kv_heads, dim = shape
    gen = torch.Generator().manual_seed(0)
    blocks_per = [-(-(c + n) // BLOCK) for c, n in seqs]
    num_blocks = sum(blocks_per) + 1
    pools = tuple(torch.randn(num_blocks, BLOCK, kv_heads, dim, generator=gen).to(kv_dtype)
                  for _ in range(2))
    width = max(blocks_per)
    order = (torch.randperm(num_blocks - 1, generator=gen) + 1 if scattered
             else torch.arange(1, num_blocks)).tolist()
    table, slots, first = [], [], 0
    for (cached, new), nb in zip(seqs, blocks_per):
        ids = order[first:first + nb]
        first += nb
        table.append(ids + [0] * (width - nb))
        slots += [ids[p // BLOCK] * BLOCK + p % BLOCK for p in range(cached, cached + new)]
    rows = sum(n for _, n in seqs)
    q = torch.randn(rows, heads, dim, generator=gen)
    k = torch.randn(rows, kv_heads, dim, generator=gen)
    v = torch.randn(rows, kv_heads, dim, generator=gen)
    meta = NativeCpuPagedAttention().build_metadata(
        slot_mapping=torch.tensor(slots), block_table=torch.tensor(table),
        context_lens=[c + n for c, n in seqs], q_lens=[n for _, n in seqs],
        start_pos=[c for c, _ in seqs], block_size=BLOCK)
    return q, k, v, pools, meta


def _best(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _torch_prefill(shape, prompt: int):
    heads, kv_heads, dim = shape
    q = torch.randn(1, heads, prompt, dim)
    k = torch.randn(1, kv_heads, prompt, dim)
    v = torch.randn(1, kv_heads, prompt, dim)
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _torch_decode(shape, batch: int, context: int):
    heads, kv_heads, dim = shape
    q = torch.randn(batch, heads, 1, dim)
    k = torch.randn(batch, kv_heads, context, dim)
    v = torch.randn(batch, kv_heads, context, dim)
    return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    info = native.describe()
    ap.add_argument("--levels", default=",".join(lv for lv in info.runnable if lv in info.built))
    ap.add_argument("--shapes", default="3b,8b,1b")
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--decode", default="16x2048", help="BATCHxCONTEXT")
    ap.add_argument("--kv", default="float16", choices=("float32", "float16", "bfloat16"))
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    kv_dtype = getattr(torch, args.kv)
    batch, context = (int(x) for x in args.decode.split("x"))
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                .splitlines() if ln.startswith("model name")), "unknown CPU")
    print(f"{cpu}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}; "
          f"{args.kv} pool, block {BLOCK}")
    print("| level | shape | workload | radixserve ms | GMAC/s | torch SDPA ms | GMAC/s |")
    print("|---|---|---|---|---|---|---|")
    for level in args.levels.split(","):
        os.environ[native.ISA_ENV] = level
        native.reset()
        if native.load() is None:
            print(f"| {level} | not available here |")
            continue
        for name in args.shapes.split(","):
            shape = SHAPES[name]
            heads, _, dim = shape
            work = [(f"prefill {args.prompt}", [(0, args.prompt)],
                     args.prompt * (args.prompt + 1) // 2,
                     _torch_prefill(shape, args.prompt)),
                    (f"decode {batch}x{context}", [(context - 1, 1)] * batch, batch * context,
                     _torch_decode(shape, batch, context))]
            work.append((f"{work[1][0]}, scattered blocks", *work[1][1:]))
            for label, seqs, tokens, peer in work:
                q, k, v, pools, meta = _case(shape, seqs, kv_dtype, "scattered" in label)
                ours = _best(lambda: ops.paged_attention(q, k, v, *pools, meta, dim ** -0.5,
                                                         None, None), args.reps)
                theirs = _best(peer, args.reps)
                macs = 2 * heads * dim * tokens / 1e9
                print(f"| {level} | {name} | {label} | {ours * 1e3:.1f} | {macs / ours:.0f} | "
                      f"{theirs * 1e3:.1f} | {macs / theirs:.0f} |", flush=True)


if __name__ == "__main__":
    main()
