"""An embedding request's pooled vector, put together from its prefill chunks (no torch).

The runner pools per chunk (`ScheduledSeq.pooling`): for mean pooling the sum of the chunk's
hidden states, for last pooling the last prompt token's state on the final chunk only. Here the
chunk sums are added up and divided by the prompt length once the prompt is done.

    prompt:  [ chunk 1 ......... | chunk 2 .... | chunk 3 (final) ]
    mean:      sum_1          +    sum_2     +    sum_3            -> / num_prompt_tokens
    last:                                                 h[-1]    -> as is

NOTE: a mean-pooling request never takes a prefix-cache hit (`PoolingParams.needs_every_token`)
and restarts from token 0 when preempted (``pooled_sum`` is reset), so every prompt token is
summed exactly once.
"""

from __future__ import annotations

from radixserve.core.request import Request


def add_chunk(request: Request, vector: list[float]) -> list[float] | None:
    """Take one chunk's pooled vector; return the request's final vector once its whole prompt
    is computed (the caller then finishes it), else None. Mutates ``request.pooled_sum``."""
    done = request.num_computed_tokens >= request.num_prompt_tokens
    if request.pooling.pooling != "mean":  # last, classify: the final chunk's vector as is
        return vector if done else None
    acc = request.pooled_sum
    request.pooled_sum = vector if acc is None else [a + b for a, b in zip(acc, vector)]
    if not done:
        return None
    n = request.num_prompt_tokens
    return [v / n for v in request.pooled_sum]


def restart(request: Request) -> None:
    """The request was preempted: its KV is gone and it is recomputed from token 0."""
    request.pooled_sum = None
