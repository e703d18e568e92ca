"""What KV cache events cost the engine: the same offline workload on the embedded model with
events on (published on ZMQ, a subscriber draining them in a thread) and off, alternating,
the prefix cache emptied before each run. Prints events per second and the mean step time
of each mode (best of the runs), and the overhead; then the cost of each part alone: hashing
a page in the engine thread, and how many events a second the publisher thread sends.

Usage:
  PYTHONHASHSEED=0 python benchmarks/kv_events_cost.py [--prompts 16] [--runs 3]
"""

from __future__ import annotations

import argparse
import threading
import time

import zmq

from radixserve import LLM, SamplingParams
from radixserve.engine.kv_events import KVEventsOutlet


def _drain(endpoint: str, counts: dict, stop: threading.Event) -> None:
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    while not stop.is_set():
        if sub.poll(50):
            sub.recv_multipart()
            counts["batches"] += 1
    sub.close(linger=0)
    ctx.term()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    bs = args.block_size
    llm = LLM(block_size=bs, num_kv_blocks=256, show_progress=False, speculative="off",
              kv_events_config={"enable_kv_cache_events": True,
                                "endpoint": "tcp://127.0.0.1:*"})
    outlet = llm.engine.kv_events
    counts, stop = {"batches": 0}, threading.Event()
    drain = threading.Thread(target=_drain, args=(outlet.publisher.endpoint, counts, stop))
    drain.start()
    time.sleep(0.3)
    # 4 shared system prefixes of 8 pages, each prompt its own 3-page tail: stores, hits,
    # and (256 blocks) some eviction
    prompts = [[100 + 7 * (i % 4) + t % 50 for t in range(8 * bs)]
               + [2000 + 97 * i + t for t in range(3 * bs)] for i in range(args.prompts)]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    llm.generate(prompts, params)  # warm up
    step = llm.engine.step
    steps = {"n": 0, "s": 0.0}

    def timed_step():
        start = time.perf_counter()
        out = step()
        steps["s"] += time.perf_counter() - start
        steps["n"] += 1
        return out
    llm.engine.step = timed_step
    best = {"on": float("inf"), "off": float("inf")}
    events_per_s = 0.0
    for _ in range(args.runs):
        for mode in ("on", "off"):
            llm.engine.scheduler.kv.prefix_cache.reset()
            outlet.sink.take()
            llm.engine.kv_events = outlet if mode == "on" else KVEventsOutlet()
            steps.update(n=0, s=0.0)
            num_events = 0
            if mode == "on":
                sink_take = outlet.sink.take

                def counting_take():
                    nonlocal num_events
                    events = sink_take()
                    num_events += len(events)
                    return events
                outlet.sink.take = counting_take
            start = time.perf_counter()
            llm.generate(prompts, params)
            wall = time.perf_counter() - start
            if mode == "on":
                outlet.sink.take = sink_take
                events_per_s = max(events_per_s, num_events / wall)
            best[mode] = min(best[mode], steps["s"] / steps["n"])
            print(f"{mode:3}: {steps['n']} steps, {1000 * steps['s'] / steps['n']:.2f} ms/step"
                  + (f", {num_events} events, {num_events / wall:.0f} events/s"
                     if mode == "on" else ""), flush=True)
    time.sleep(0.5)
    stop.set()
    drain.join()
    llm.engine.kv_events = outlet
    print(f"best step: on {1000 * best['on']:.2f} ms, off {1000 * best['off']:.2f} ms, "
          f"overhead {100 * (best['on'] / best['off'] - 1):+.1f}%; peak {events_per_s:.0f} "
          f"events/s; batches received {counts['batches']}, dropped {outlet.num_dropped}")
    _parts(outlet, bs)
    llm.close()


def _parts(outlet: KVEventsOutlet, bs: int) -> None:
    """The engine thread's cost per stored page (hashing), and the publisher's capacity."""
    from radixserve.core.kv.kv_events import KVEventLog

    log, tokens = KVEventLog(bs, "0"), list(range(64 * bs))
    start = time.perf_counter()
    for _ in range(50):
        log.stored(None, tokens)
    per_page = (time.perf_counter() - start) / (50 * 64)
    events = log.take()[:1] * 10
    pub, n = outlet.publisher, 2000
    before, start = pub.num_published, time.perf_counter()
    for _ in range(n):
        pub.publish(events)  # 10 BlockStored of 64 pages a batch
    while pub.num_published + pub.num_dropped - before < n:
        time.sleep(0.001)
    wall = time.perf_counter() - start
    print(f"hashing: {1e6 * per_page:.1f} us per stored page (engine thread); publisher: "
          f"{10 * n / wall:.0f} events/s ({64 * 10 * n / wall:.0f} pages/s) sent, "
          f"{pub.num_dropped} dropped")


if __name__ == "__main__":
    main()
