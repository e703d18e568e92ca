"""Engine builds for the KV events tests, importable by a spawned engine process."""

from __future__ import annotations

_KEEP = []  # the LLM owning the engine lives as long as the process


def embedded_with_stalled_events():
    """The embedded model's engine, its KV events publisher stuck (`kv_event_stall`) behind
    a queue of one batch: from the second batch on, events are dropped."""
    from kv_event_stall import stall_publisher

    from radixserve import LLM

    llm = LLM(block_size=16, num_kv_blocks=64, threads=1, show_progress=False,
              kv_events_config={"enable_kv_cache_events": True, "max_queue_size": 1,
                                "endpoint": "tcp://127.0.0.1:*"})
    stall_publisher(llm.engine)
    _KEEP.append(llm)
    return llm.engine
