"""What answering /v1/engine/state costs the engine step.

Two figures: (1) the embedded model decoding 8 requests in process, each step timed, in
alternating 2-second windows with and without an ``EngineStateQuery`` answered (summary built
and msgpack-encoded, as core_proc does) once a second; (2) the summary alone on a large
radix tree (2,001 nodes: 2,000 children under one shared prefix), which the bound keeps
small. Run: ``python benchmarks/bench_engine_state.py`` (about 40 s).
"""

from __future__ import annotations

import statistics
import time

import msgspec

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.radix_cache import RadixCache
from radixserve.messages import EngineCoreOutputs, EngineStateQuery


def big_tree_cost() -> float:
    pool = BlockPool(60_000)
    cache = RadixCache(pool, 16)
    shared = list(range(1000, 1000 + 256))
    for i in range(2000):  # 2000 requests: the shared prefix, then 10 private pages each
        tokens = shared + [i] * 16 + list(range(i * 200, i * 200 + 144))
        m = cache.match_prefix(tokens)
        cache.lock(m.handle)
        pool.share(m.block_ids)
        blocks = m.block_ids + pool.allocate(len(tokens) // 16 - len(m.block_ids))
        cache.release(tokens, blocks, m.handle)
    times = []
    for _ in range(50):
        t = time.perf_counter()
        cache.summary(48, 4)
        times.append(time.perf_counter() - t)
    median = statistics.median(times)
    print(f"radix summary on {cache.num_nodes} nodes: median {median * 1e6:.0f} us")
    return median


def step_cost(seconds: float = 24.0) -> None:
    from radixserve import LLM
    from radixserve.messages import EngineCoreRequest
    from radixserve.sampling_params import SamplingParams

    llm = LLM(show_progress=False)
    engine, encoder = llm.engine, msgspec.msgpack.Encoder()
    params = SamplingParams(max_tokens=100_000, ignore_eos=True, temperature=0)
    prompt = llm.tokenizer.encode("Tell me a long story about the sea.")
    for i in range(8):
        engine.add_request(EngineCoreRequest(
            request_id=f"r{i}", prompt_token_ids=prompt + [i + 10], sampling_params=params))
    for _ in range(5):
        engine.step()  # prefill and warm-up
    windows = {False: [], True: []}
    state_us = []
    end, next_poll = time.monotonic() + seconds, 0.0
    while time.monotonic() < end:
        polling = int(time.monotonic() // 2) % 2 == 1  # alternating 2 s windows
        now = time.monotonic()
        if polling and now >= next_poll:
            t = time.perf_counter()
            encoder.encode(EngineCoreOutputs([], time.time(), None,
                                             engine.state(EngineStateQuery())))
            state_us.append((time.perf_counter() - t) * 1e6)
            next_poll = now + 1.0
        t = time.perf_counter()
        engine.step()
        windows[polling].append(time.perf_counter() - t)
    quiet, polled = (statistics.median(windows[k]) * 1e3 for k in (False, True))
    print(f"8 requests decoding: median step {quiet:.2f} ms without polling "
          f"({len(windows[False])} steps), {polled:.2f} ms while polled at 1 Hz "
          f"({len(windows[True])} steps); state query answered {len(state_us)} times, "
          f"median {statistics.median(state_us):.0f} us "
          f"({statistics.median(state_us) / 1e4:.4f} % of a second)")


if __name__ == "__main__":
    big_tree_cost()
    step_cost()
