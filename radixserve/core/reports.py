"""What the engine core reports upward, as plain records: each step's new tokens per request
(`EngineCoreOutput`) and counters (`SchedulerStats`), and the on-demand summary of what it
holds (`EngineState`, with `RequestInfo` and `CacheNodeInfo`).

They are msgspec Structs so the wire (radixserve/messages.py) embeds them as they are: no
conversion per token. Like the messages, they hold only numbers, strings and lists of them (no
reference cycles possible), so the garbage collector does not track them (``gc=False``).
"""

from __future__ import annotations

import msgspec


class PromptProgress(msgspec.Struct, array_like=True, gc=False):
    """How far a request's prompt is prefilled, llama-server's ``prompt_progress``: ``total``
    prompt tokens, ``cache`` of them taken from the prefix cache, ``processed`` in the KV
    cache now (the cached ones included), ``time_ms`` since its prefill started."""

    total: int
    cache: int
    processed: int
    time_ms: int


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """New tokens of one request from one step. ``top_logprobs`` rows are [(id, logprob), ...].

    ``queue_time`` (seconds from arrival to first scheduling) rides on the first output only.
    ``error`` is set, with finish_reason "abort", when the engine refused the request, and
    with finish_reason "error" when a fault while running it ended it (a server error).
    ``pooled`` is an embedding request's pooled hidden state (its one, finishing output).
    ``prompt_logprobs`` / ``prompt_top_logprobs``: a request that asked for them gets every
    prompt token's (entry 0 None; core/prompt_logprobs.py) on its first output.
    ``prompt_progress``: set (and nothing else) on an output of its own after each prefill
    chunk of a request whose params ask for it (core/prompt_progress.py).
    """

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    num_cached_tokens: int = 0
    queue_time: float | None = None
    error: str | None = None
    pooled: list[float] | None = None
    prompt_logprobs: list[float | None] | None = None
    prompt_top_logprobs: list[list[tuple[int, float]] | None] | None = None
    prompt_progress: PromptProgress | None = None


class SchedulerStats(msgspec.Struct, array_like=True, gc=False):
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    num_kv_blocks: int = 0
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    num_preemptions: int = 0
    spec_num_drafts: int = 0  # speculative decoding: verified drafts, their tokens, accepted
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = []  # drafts whose i-th token was accepted
    spec_drafted_per_pos: list[int] = []  # drafts that had an i-th token
    num_kv_events_dropped: int = 0  # KV cache events the publisher dropped (engine/kv_events.py)
    num_kv_event_subscribers_behind: int = 0  # times one reached its high-water mark
    num_kv_event_subscribers_refused: int = 0  # connections closed past max_subscribers
    kv_disk_hit_tokens: int = 0  # the disk tier (kvdisk/stats.py): prefix hits read back
    kv_disk_pages_written: int = 0
    kv_disk_pages_read: int = 0
    kv_disk_pages_corrupt: int = 0  # damaged or foreign files found (and deleted)
    kv_disk_pages_dropped: int = 0  # evicted while the writer was behind: not saved
    kv_disk_bytes_written: int = 0
    kv_disk_bytes_read: int = 0
    images_encoded: int = 0  # the image encoder (image_stats.py): images it ran on
    image_encoder_hits: int = 0  # images whose encoder output was kept from an earlier step
    image_encode_seconds: float = 0.0
    image_rows: int = 0  # image-token rows computed (not from the prefix cache)


class RequestInfo(msgspec.Struct, array_like=True, gc=False):
    """One running or waiting request as the engine view shows it."""

    request_id: str
    status: str  # "running" | "waiting"
    num_computed_tokens: int
    num_tokens: int
    num_prompt_tokens: int
    max_tokens: int  # output tokens it may make
    priority: int
    arrival_time: float  # wall clock (time.time())
    num_cached_tokens: int = 0
    num_preemptions: int = 0


class CacheNodeInfo(msgspec.Struct, array_like=True, gc=False):
    """One radix-tree node of the summary; ``parent`` indexes the summary's node list (-1:
    a child of the root). ``head`` is its first few token ids (for a preview);
    ``num_hidden_children`` counts the children left out of the summary. ``snapshot``: it
    holds a hybrid model's recurrent state at its end (core/kv/radix_snapshots.py), where a
    hit can resume."""

    parent: int
    depth: int
    num_tokens: int
    num_blocks: int
    hits: int
    lock_ref: int
    num_children: int
    num_hidden_children: int
    head: list[int]
    snapshot: bool = False


class EngineState(msgspec.Struct, array_like=True, gc=False):
    """A bounded summary of what the engine holds, answered to an ``EngineStateQuery``:
    at most ``max_requests`` requests of each kind and ``max_nodes`` tree nodes; the ``num_*``
    totals count everything."""

    running: list[RequestInfo]
    waiting: list[RequestInfo]
    num_running: int
    num_waiting: int
    num_kv_blocks: int
    num_free_blocks: int
    num_evictable_blocks: int  # cached, referenced by no request
    num_cached_blocks: int  # all blocks the prefix cache holds (evictable + protected)
    block_size: int
    cache_nodes: list[CacheNodeInfo]
    num_cache_nodes: int
    prefix_query_tokens: int
    prefix_hit_tokens: int
    num_preemptions: int
    summary_us: float = 0.0  # what building this summary cost the engine
