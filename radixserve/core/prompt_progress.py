"""Prompt progress: after each prefill chunk, how far a request's prompt is in the KV cache.

A request whose ``SamplingParams.return_progress`` is set gets, on each step that ran a chunk
of its prompt, an `EngineCoreOutput` of its own holding only a `PromptProgress` (llama-server's
``prompt_progress``: total, cache, processed, time_ms), placed before the step's token output
for it. Nothing is sent for any other request, nor for a step that only decodes.

    prompt: [ cached (prefix cache) | computed by earlier chunks | this chunk | rest ... ]
            |<------------------- processed ------------------------------>|
            |<---------------------------------- total ------------------------------->|

A request preempted before its first token recomputes its prompt, so its ``processed`` may go
back; the API process passes only advancing records on (frontend/async_llm.py). One preempted
after its first token has its output in the KV to recompute too: it reports nothing more.
"""

from __future__ import annotations

from radixserve.core.reports import EngineCoreOutput, PromptProgress
from radixserve.core.request import Request


def progress_outputs(requests: list[Request], now: float) -> list[EngineCoreOutput]:
    """One progress output per request that asked for it and has just computed a chunk of
    its prompt (``requests``: those whose chunk ran this step, their ``num_computed_tokens``
    already advanced); ``now`` is ``time.time()``. Reads the requests, changes nothing."""
    outputs = []
    for request in requests:
        if request.output_token_ids:
            continue  # recomputing after a preemption: its prompt was reported done
        total = request.num_prompt_tokens
        # the prefill started when it was first scheduled (queue_time after its arrival)
        started = request.arrival_time + (request.queue_time or 0.0)
        progress = PromptProgress(total, request.num_cached_tokens,
                                  min(request.num_computed_tokens, total),
                                  max(0, int((now - started) * 1000)))
        outputs.append(EngineCoreOutput(request.request_id, [], prompt_progress=progress))
    return outputs
