"""``bench serve --api messages``: the workload through Anthropic's ``POST /v1/messages``.

The same conversations and sampling as the chat route, sent as Messages requests (streamed);
its events are read into the run's records like chat chunks: ``text_delta`` / ``thinking_delta``
text times the tokens, ``message_start`` and ``message_delta`` give the usage, ``message_stop``
ends the response, an ``error`` event fails it.
"""

from __future__ import annotations

PATH = "/v1/messages"


def payload(history: list[dict], max_tokens: int, model: str | None, args) -> dict:
    body: dict = {"max_tokens": max_tokens, "stream": True, "messages": list(history),
                  "model": model or "default"}
    if args.temperature is not None:
        body["temperature"] = args.temperature
    if args.ignore_eos:
        body["ignore_eos"] = True  # radixserve's extension, as on the chat route
    return body


def on_event(event: dict, stream, now: float, start: float) -> None:
    """Update ``stream`` (a `serve._Stream`) with one decoded event."""
    kind, record = event.get("type"), stream.record
    if kind == "error":
        err = event.get("error") or {}
        record.error = str(err.get("message", err) if isinstance(err, dict) else err)
    elif kind == "message_start":
        usage = (event.get("message") or {}).get("usage") or {}
        record.cached_tokens = usage.get("cache_read_input_tokens") or 0
        record.prompt_tokens = (usage.get("input_tokens") or 0) + record.cached_tokens
    elif kind == "content_block_delta":
        delta = event.get("delta") or {}
        stream.text(delta.get("text") or "", delta.get("thinking") or "", start, now)
    elif kind == "message_delta":
        record.usage = True
        record.output_tokens = (event.get("usage") or {}).get("output_tokens") or 0
        stream.finished = True
    elif kind == "message_stop":
        stream.done = True
