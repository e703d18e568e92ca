"""KV memory a sliding-window model holds with and without releasing out-of-window blocks
(core/kv/kv_groups.py), from the pool accounting of the real model's config (no weights
loaded, no forward): Gemma 3 270M by default (18 layers, 15 sliding with window 512, 3 global;
one KV head of 256).

Prints, for one sequence of each length, the pool blocks and bytes it holds while decoding
(and at most while prefilling in chunks of ``--chunk``), then how many sequences of
``--concurrent-len`` tokens decode at once in a ``--budget-gb`` pool: by the accounting, and
counted by driving the real Scheduler and KVCacheManager with a fake runner (128 queued
requests of that length, 128 tokens of it generated); before (one KV group: every layer
keeps every token) and after (two groups). ``--real N``: also the real model, greedy on an
N-token prompt with blocks released and kept (same tokens?, blocks held).

    PYTHONPATH=. python benchmarks/bench_kv_groups.py [--model PATH.gguf] [--budget-gb 1.0]
"""

from __future__ import annotations

import argparse
import sys
import time
from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_groups import KVGroups
from radixserve.core.kv.kv_manager import KVCacheManager
from radixserve.core.kv.no_cache import NoPrefixCache
from radixserve.core.request import Request
from radixserve.core.sched_config import SchedulerConfig
from radixserve.core.sched_output import ModelRunnerOutput
from radixserve.core.scheduler import Scheduler
from radixserve.sampling_params import SamplingParams


def gemma3_config(path: str | None):
    from radixserve.models.loader import load_model_config, open_gguf
    from radixserve.models.source import ModelSource

    source = ModelSource.resolve(path or _default_path())
    return load_model_config(source, open_gguf(source.path))


def bytes_per_unit(model, groups: KVGroups, block_size: int, elem: int) -> int:
    return 2 * groups.unit_layers * block_size * model.num_kv_heads * model.head_dim * elem


def concurrent(groups: KVGroups, num_units: int, block_size: int, seq_len: int,
               chunk: int, num_requests: int = 128, max_steps: int = 600) -> int:
    """How many sequences of ``seq_len`` tokens (``seq_len - 128`` prompt, 128 generated)
    the scheduler runs at once, at most, in a pool of ``num_units`` (``num_requests``
    queued at once; stops at a preemption or after ``max_steps``)."""
    pool = BlockPool(num_units, with_null_block=groups.has_sliding)
    kv = KVCacheManager(pool, NoPrefixCache(pool), block_size, groups)
    s = Scheduler(SchedulerConfig(num_requests, chunk), kv, seq_len + 1)
    for i in range(num_requests):
        s.add_request(Request(str(i), [1] * (seq_len - 128), SamplingParams(), frozenset(),
                              0, max_tokens=128))
    most = 0
    for _ in range(max_steps):
        if not s.num_unfinished or s.num_preemptions:
            break
        out = s.schedule()
        most = max(most, len(s.running))
        ids = [q.request_id for q in out.seqs if q.sample]
        none = [None] * len(ids)
        s.update_from_output(out, ModelRunnerOutput(ids, [2] * len(ids), none, none))
    return most


def real_run(path: str, prompt_len: int, max_tokens: int, budget_gb: float,
             order=("released", "kept")) -> None:
    """Greedy on the real model, blocks released vs kept (the engine built with one KV
    group): the same tokens, and the pool blocks the sequence held at its last step."""
    import random

    from radixserve import LLM, SamplingParams
    from radixserve.core.kv import kv_groups

    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    results = {}
    for name in order:
        if name == "kept":  # every layer in one group: nothing is released
            original = kv_groups.KVGroups.from_windows
            kv_groups.KVGroups.from_windows = classmethod(lambda cls, w: cls.single(len(w)))
        try:
            llm = LLM(path, kv_cache_memory_gb=budget_gb, show_progress=False)
        finally:
            if name == "kept":
                kv_groups.KVGroups.from_windows = original
        prompt = [rng.randrange(1000, llm.engine.vocab_size) for _ in range(prompt_len)]
        rng.seed(0)
        kv = llm.engine.scheduler.kv
        seen = {"most": 0}
        allocate = kv.allocate_slots

        def spy(request, n, allocate=allocate, kv=kv, seen=seen):
            ok = allocate(request, n)
            null = kv.block_pool.null_block
            seen["last"] = sum(b != null for t in kv.tables(request) for b in t)
            seen["most"] = max(seen["most"], seen["last"])
            seen["pool"] = kv.num_usable_blocks - kv.block_pool.num_free_blocks
            return ok

        kv.allocate_slots = spy
        start = time.perf_counter()
        out = llm.generate({"prompt_token_ids": prompt}, params)[0].outputs[0].token_ids
        seconds = time.perf_counter() - start
        pool = kv.block_pool
        mib = pool_bytes(llm) / pool.num_blocks / 2**20
        print(f"  {name}: pool {pool.num_blocks} blocks of {kv.groups.unit_layers} layers "
              f"({mib * 1024:.0f} KiB each); the sequence held {seen['most']} at most "
              f"({seen['most'] * mib:.1f} MiB), {seen['last']} at its last step "
              f"({seen['last'] * mib:.1f} MiB; the pool, prefix cache included: "
              f"{seen['pool']}); {seconds:.1f} s")
        results[name] = out
        del llm, kv
    print(f"  greedy tokens equal: {results['kept'] == results['released']}")


def scheduler_cpu_ms(runs: int = 4) -> float:
    """CPU ms per step of the Scheduler + KVCacheManager + RadixCache with one KV group and
    a fake runner: 64 requests of 200 prompt tokens, each decoding 400 (min of ``runs``)."""
    from radixserve.core.kv.radix_cache import RadixCache

    best = float("inf")
    for _ in range(runs):
        pool = BlockPool(20000)
        kv = KVCacheManager(pool, RadixCache(pool, 16), 16)
        s = Scheduler(SchedulerConfig(64, 2048), kv, 4096)
        for i in range(64):
            s.add_request(Request(str(i), [i] * 200, SamplingParams(max_tokens=400),
                                  frozenset(), 0, max_tokens=400))
        start, steps = time.process_time(), 0
        while s.num_unfinished:
            out = s.schedule()
            ids = [q.request_id for q in out.seqs if q.sample]
            none = [None] * len(ids)
            s.update_from_output(out, ModelRunnerOutput(ids, [2] * len(ids), none, none))
            steps += 1
        best = min(best, (time.process_time() - start) / steps * 1e3)
    return best


def pool_bytes(llm) -> int:
    """Bytes of the runner's K/V tensors (each shared tensor once)."""
    tensors = {id(t): t for kv in llm.engine.runner.kv_caches for t in kv}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="a GGUF file (default: Gemma 3 270M)")
    ap.add_argument("--budget-gb", type=float, default=1.0)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=2048, help="max_num_batched_tokens")
    ap.add_argument("--elem-bytes", type=int, default=2, help="2: float16 pool (auto on CPU)")
    ap.add_argument("--concurrent-len", type=int, default=4096)
    ap.add_argument("--real", type=int, default=0, metavar="PROMPT_LEN",
                    help="also run the real model: a prompt of this many tokens, greedy")
    ap.add_argument("--real-tokens", type=int, default=64)
    ap.add_argument("--real-order", default="released,kept")
    ap.add_argument("--sched-cpu", action="store_true",
                    help="only the one-group scheduler's CPU ms per step (compare trees)")
    args = ap.parse_args()
    if args.sched_cpu:
        print(f"scheduler + KV manager + radix cache, one group: {scheduler_cpu_ms():.3f} "
              "CPU ms per step (64 decodes)")
        return
    model = gemma3_config(args.model)
    bs = args.block_size
    windows = [model.layer_window(i) for i in range(model.num_layers)]
    after = KVGroups.from_windows(windows)
    before = KVGroups.single(model.num_layers)
    print(f"model: {model.architecture}, {model.num_layers} layers; groups: {after.describe()}")
    for name, groups in (("before", before), ("after", after)):
        unit = bytes_per_unit(model, groups, bs, args.elem_bytes)
        num_units = int(args.budget_gb * 1024**3 // unit)
        print(f"\n{name}: a pool block = {groups.unit_layers} layers x {bs} tokens = "
              f"{unit / 1024:.0f} KiB; {args.budget_gb} GiB = {num_units} blocks")
        for n in (8192, 32768):
            decode = groups.units_held(n, bs, 1)
            prefill = groups.units_held(n, bs, args.chunk)
            print(f"  one {n}-token sequence: {decode} blocks = {decode * unit / 2**20:.1f} "
                  f"MiB decoding ({prefill} = {prefill * unit / 2**20:.1f} MiB at most while "
                  f"prefilling {args.chunk} a step)")
        n = args.concurrent_len
        fit = (num_units - groups.has_sliding) // groups.units_held(n, bs, 1)
        most = concurrent(groups, num_units, bs, n, args.chunk)
        print(f"  {n}-token sequences decoding at once in {args.budget_gb} GiB: {fit} by the "
              f"accounting; {most} run by the scheduler (fake runner) before it preempts")
        longest = groups.max_tokens(num_units - groups.has_sliding, bs, args.chunk)
        print(f"  longest sequence the pool holds: {min(longest, 1 << 30)} tokens")
    if args.real:
        print(f"\nreal run: {args.real}-token prompt, {args.real_tokens} greedy tokens")
        real_run(args.model or _default_path(), args.real, args.real_tokens, args.budget_gb,
                 tuple(args.real_order.split(",")))


def _default_path() -> str:
    sys.path.insert(0, "tests")
    from real_models import gemma3_270m

    return gemma3_270m()


if __name__ == "__main__":
    main()
