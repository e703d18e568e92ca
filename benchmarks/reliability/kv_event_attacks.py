"""KV-event subscribers against the engine (issue 62 item 7): subscribers that never read,
more subscribers than ``max_subscribers``, and replay requests that are never read. Runs the
embedded model in-process (the mock engine publishes no KV events) and prints the engine
process's RSS growth and the publisher's counters for each.

    .venv/bin/python benchmarks/reliability/kv_event_attacks.py [--stuck 4] [--extra 8]
"""

from __future__ import annotations

import argparse
import os
import time

import zmq
from common import cpu_name, rss_mb

from radixserve import LLM, SamplingParams


def _sub(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 1)
    sub.setsockopt(zmq.RCVBUF, 4096)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    return sub


def _work(llm: LLM, rounds: int) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    for r in range(rounds):  # fresh prompts: every step stores pages, so every step publishes
        llm.generate([[1000 + 997 * r + 13 * i + t for t in range(256)] for i in range(8)],
                     params)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stuck", type=int, default=4, help="subscribers that never read")
    parser.add_argument("--extra", type=int, default=8, help="subscribers past the limit")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    llm = LLM(num_kv_blocks=256, show_progress=False,
              kv_events_config={"enable_kv_cache_events": True,
                                "endpoint": "tcp://127.0.0.1:*",
                                "replay_endpoint": "tcp://127.0.0.1:*"})
    pub = llm.engine.kv_events.publisher
    print(f"{cpu_name()}; hwm {pub.config.hwm}, max_subscribers {pub.config.max_subscribers}")
    ctx = zmq.Context()
    _work(llm, 2)
    start = time.monotonic()
    _work(llm, 3)
    print(f"no subscribers: 3 rounds in {time.monotonic() - start:.2f} s")
    base = rss_mb(os.getpid())
    stuck = [_sub(ctx, pub.endpoint) for _ in range(args.stuck)]
    time.sleep(0.5)
    _work(llm, args.rounds)
    print(f"{args.stuck} subscribers that never read: RSS +{rss_mb(os.getpid()) - base:.0f} MB "
          f"over {pub.num_published} batches; subscribers behind counted "
          f"{pub.num_subscribers_behind}; events lost for all {pub.num_dropped_events}")
    extra = [_sub(ctx, pub.endpoint) for _ in range(args.extra + 16 - args.stuck)]
    time.sleep(1.0)
    start = time.monotonic()
    _work(llm, 3)
    print(f"{len(stuck) + len(extra)} subscribers: 3 rounds in {time.monotonic() - start:.2f} s; "
          f"{pub.num_refused_subscribers} connections refused so far (limit {pub.config.max_subscribers})")
    for s in extra[16 - args.stuck:]:
        s.close(linger=0)  # the refused ones leave
    time.sleep(0.5)
    dealers = []
    for _ in range(8):  # replay everything, read nothing
        d = ctx.socket(zmq.DEALER)
        d.connect(pub.replay_endpoint)
        d.send_multipart((b"", (0).to_bytes(8, "big")))
        dealers.append(d)
    start = time.monotonic()
    _work(llm, 3)
    print(f"8 replays of the whole buffer never read: 3 rounds in "
          f"{time.monotonic() - start:.2f} s, RSS +{rss_mb(os.getpid()) - base:.0f} MB, "
          f"behind counted {pub.num_subscribers_behind}")
    for s in (*stuck, *extra, *dealers):
        s.close(linger=0)
    llm.close()
    ctx.term()


if __name__ == "__main__":
    main()
