"""Token-level stop conditions, checked by the scheduler after each sampled token.

Stop *strings* need text and are handled where detokenization happens (the API process or
the offline ``LLM``), which then aborts the request.
"""

from __future__ import annotations

from radixserve.core.request import Request


def check_stop(request: Request, max_model_len: int) -> str | None:
    """Return the finish reason ("stop" or "length") if the last appended token ends ``request``."""
    num_output = request.num_output_tokens
    if num_output >= request.sampling_params.min_tokens:
        if request.output_token_ids[-1] in request.stop_token_ids:
            return "stop"
    if num_output >= request.max_tokens or request.num_tokens >= max_model_len:
        return "length"
    return None
