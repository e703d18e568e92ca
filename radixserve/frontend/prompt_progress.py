"""Prompt progress as each API's stream shows it (``return_progress``: llama-server's option).

The engine reports after each chunk of a prompt how far its prefill is (core/prompt_progress.py;
`AsyncLLM.generate` yields it as a `StepDelta` with ``progress`` set). Each route writes it in
its own stream, as llama-server does where it has a shape for it:

* OpenAI chat and completions: a chunk whose choice has the assistant role and null content
  (chat) or empty text (completions), with a top-level ``prompt_progress`` object;
* llama.cpp's ``/infill``: a ``data:`` object with empty content and ``prompt_progress``;
* Responses: a ``response.in_progress`` event with ``prompt_progress`` beside its ``response``;
* Anthropic Messages (no shape for it in llama-server): a ``ping`` event with
  ``prompt_progress``, after ``message_start`` (the protocol allows any number of pings;
  SDKs skip them);
* Ollama: nothing by default (its clients know no such line); asked for with radixserve's
  top-level ``return_progress``, a line with empty content (``done`` false) and
  ``prompt_progress``, which clients that do not know it read as an empty piece of text.

The first report comes after the first chunk ran. (llama-server also sends one before, with
``processed == cache``; here it would leave the engine in the same message as the first
chunk's, so it is not sent.)

``prompt_progress`` is ``{"total", "cache", "processed", "time_ms"}``: prompt tokens, those
taken from the prefix cache, those in the KV cache now (cached included), and milliseconds
since the prefill started. The whole progress is ``processed / total``; the computed part's
``(processed - cache) / (total - cache)``.
"""

from __future__ import annotations

import msgspec

from radixserve.core.reports import PromptProgress


def progress_fields(progress: PromptProgress) -> dict[str, int]:
    """llama-server's ``prompt_progress`` object."""
    return {"total": progress.total, "cache": progress.cache,
            "processed": progress.processed, "time_ms": progress.time_ms}


def chat_progress_event(request_id: str, created: int, model: str, index: int,
                        progress: PromptProgress) -> str:
    """The SSE event of llama-server's ``chat.completion.chunk`` for a progress report:
    choice ``index`` with the assistant role and null content, and ``prompt_progress``."""
    choice = {"index": index, "delta": {"role": "assistant", "content": None},
              "logprobs": None, "finish_reason": None}
    return _sse({"id": request_id, "object": "chat.completion.chunk", "created": created,
                 "model": model, "choices": [choice],
                 "prompt_progress": progress_fields(progress)})


def completion_progress_event(request_id: str, created: int, model: str, index: int,
                              progress: PromptProgress) -> str:
    """The SSE event of llama-server's ``text_completion`` chunk for a progress report:
    choice ``index`` with empty text, and ``prompt_progress``."""
    choice = {"index": index, "text": "", "logprobs": None, "finish_reason": None}
    return _sse({"id": request_id, "object": "text_completion", "created": created,
                 "model": model, "choices": [choice],
                 "prompt_progress": progress_fields(progress)})


def _sse(payload: dict) -> str:
    return f"data: {msgspec.json.encode(payload).decode()}\n\n"
