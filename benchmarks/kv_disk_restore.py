"""The disk tier (--kv-disk-cache) against recomputing: a prompt's prefill from scratch, then
its pages evicted to the disk and the same prompt again, read back (restore GB/s: the page
bytes over the time `KVDiskTier.load` took, files in the page cache and, after
``posix_fadvise(DONTNEED)`` on each, from the disk itself), on the embedded model or
``--model`` (a hybrid model's recurrent-state snapshot is read back with its pages, timed with
them). A request restored from disk is compared with the same request hitting the radix tree
(the last page's tokens are computed in both).

    .venv/bin/python benchmarks/kv_disk_restore.py [--prompt-len 4096] [--dir /tmp/kvd] \
        [--model /tmp/q08.gguf]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from radixserve import LLM, SamplingParams
from radixserve.kernels import native

ONE = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


def _drop_page_cache(folder: str) -> None:
    for d, _, files in os.walk(folder):
        for f in files:
            fd = os.open(os.path.join(d, f), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _timed_load(tier):
    """Wrap ``tier.load`` and ``tier.load_state`` to sum their seconds (lookups and hashing
    not included)."""
    spent = [0.0]

    def timed(method):
        def run(*args):
            t0 = time.perf_counter()
            try:
                return method(*args)
            finally:
                spent[0] += time.perf_counter() - t0
        return run

    tier.load, tier.load_state = timed(tier.load), timed(tier.load_state)
    return spent


def _round(llm: LLM, prompt: list[int], folder: str, cold: bool) -> dict:
    kv = llm.engine.scheduler.kv
    t0 = time.perf_counter()
    llm.generate([{"prompt_token_ids": prompt}], ONE)
    compute = time.perf_counter() - t0
    t0 = time.perf_counter()
    kv.prefix_cache.evict(kv.prefix_cache.num_evictable_blocks)  # every page to the disk
    kv.disk.flush()
    save = time.perf_counter() - t0
    if cold:
        _drop_page_cache(folder)
    spent = _timed_load(kv.disk)
    before = kv.disk.store.stats.num_bytes_read
    t0 = time.perf_counter()
    out = llm.generate([{"prompt_token_ids": prompt}], ONE)[0]
    restore = time.perf_counter() - t0
    del kv.disk.load, kv.disk.load_state  # the instance attributes: back to the methods
    read = kv.disk.store.stats.num_bytes_read - before
    t0 = time.perf_counter()
    llm.generate([{"prompt_token_ids": prompt}], ONE)  # all in the tree now
    tree = time.perf_counter() - t0
    kv.prefix_cache.reset()
    for d, _, files in os.walk(folder):  # the next round computes and writes again
        for f in files:
            os.remove(os.path.join(d, f))
    return {"compute_s": compute, "save_s": save, "restore_request_s": restore,
            "load_s": spent[0], "bytes": read, "cached": out.num_cached_tokens,
            "tree_hit_s": tree}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-len", type=int, default=4096)
    parser.add_argument("--dir", default=None, help="the cache folder (default: a temp one)")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--model", default=None, help="a GGUF (default: the embedded model)")
    args = parser.parse_args()
    folder = args.dir or tempfile.mkdtemp(prefix="kvd-")
    blocks = args.prompt_len // 16 + 8
    llm = LLM(args.model, num_kv_blocks=blocks, max_model_len=blocks * 16, show_progress=False,
              kv_disk_cache=folder, kv_disk_cache_gb=4.0, speculative="off")
    prompt = [(37 * i) % 40000 + 100 for i in range(args.prompt_len)]
    print(f"cpu {native.describe().level}; prompt {args.prompt_len} tokens; page "
          f"{llm.engine.scheduler.kv.disk.pages.page_bytes / 1024:.0f} KiB; folder {folder}")
    for rep in range(args.reps):
        for cold in (False, True):
            r = _round(llm, prompt, folder, cold)
            print(f"rep {rep} {'disk ' if cold else 'cache'}: prefill {r['compute_s']:.2f} s; "
                  f"save {r['save_s']:.2f} s; restored {r['cached']} tokens, "
                  f"{r['bytes'] / 1e6:.0f} MB in {r['load_s']:.3f} s = "
                  f"{r['bytes'] / r['load_s'] / 1e9:.2f} GB/s; the request with the restore "
                  f"{r['restore_request_s']:.2f} s ({r['compute_s'] / r['restore_request_s']:.1f}x"
                  f" faster), a radix-tree hit {r['tree_hit_s']:.2f} s")
    llm.close()


if __name__ == "__main__":
    main()
