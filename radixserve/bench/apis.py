"""The request and stream formats `bench serve` speaks (``--api``): each builds a streamed
request from a conversation's history (``payload``, then ``finalize`` once the shared fields
are set), splits the response into events (``parse``: one line → an event dict, "[DONE]" or
None) and reads them into a `_Stream` (``stream.text``, ``stream.usage``, ``stream.error``,
``stream.finished``)."""

from __future__ import annotations

import argparse
import json

from radixserve.bench import api_messages, api_ollama


def sse_event(raw: bytes) -> dict | str | None:
    """An SSE line: its event, "[DONE]", or None (separators, comments, event: lines)."""
    line = raw.strip()
    if not line.startswith(b"data:"):
        return None
    data = line[5:].strip()
    return "[DONE]" if data == b"[DONE]" else json.loads(data)


class OpenAIApi:
    """``/v1/chat/completions`` or ``/v1/completions`` (``--endpoint``), with usage in the
    last chunk (``stream_options.include_usage``)."""

    parse = staticmethod(sse_event)
    finalize = staticmethod(lambda body: body)

    def __init__(self, args: argparse.Namespace) -> None:
        self.chat = args.endpoint == "chat"
        self.path = "/v1/chat/completions" if self.chat else "/v1/completions"

    def payload(self, history: list[dict], max_tokens: int) -> dict:
        body: dict = {"max_tokens": max_tokens, "stream": True,
                      "stream_options": {"include_usage": True}}
        if self.chat:
            body["messages"] = list(history)
        elif len(history) == 1:
            body["prompt"] = history[0]["content"]
        else:
            body["prompt"] = "".join(f"{m['role'].capitalize()}: {m['content']}\n"
                                     for m in history) + "Assistant:"
        return body

    def read(self, event: dict, stream, start: float, now: float) -> None:
        if event.get("error"):
            return stream.error(event["error"])
        if usage := event.get("usage"):
            details = usage.get("prompt_tokens_details") or {}
            stream.usage(usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0,
                         details.get("cached_tokens"))
        for choice in event.get("choices") or ():
            if choice.get("finish_reason"):
                stream.finished = True
            if "delta" in choice:  # chat's shape (and Ollama's lines, read as chat)
                delta = choice.get("delta") or {}
                text = delta.get("content") or ""
                other = delta.get("reasoning_content") or delta.get("reasoning") or ""
            else:
                text, other = choice.get("text") or "", ""
            stream.text(text, other, start, now)


class ResponsesApi:
    """``/v1/responses``: typed events, usage in the closing ``response.completed`` (or
    ``response.incomplete``); nothing is stored (``store: false``)."""

    path = "/v1/responses"
    parse = staticmethod(sse_event)
    finalize = staticmethod(lambda body: body)

    def __init__(self, args: argparse.Namespace) -> None:
        pass

    def payload(self, history: list[dict], max_tokens: int) -> dict:
        return {"input": list(history), "max_output_tokens": max_tokens, "stream": True,
                "store": False}

    def read(self, event: dict, stream, start: float, now: float) -> None:
        kind = event.get("type")
        if kind == "response.output_text.delta":
            stream.text(event.get("delta") or "", "", start, now)
        elif kind == "response.reasoning_text.delta":
            stream.text("", event.get("delta") or "", start, now)
        elif kind in ("response.completed", "response.incomplete"):
            stream.finished = True
            usage = (event.get("response") or {}).get("usage") or {}
            details = usage.get("input_tokens_details") or {}
            stream.usage(usage.get("input_tokens") or 0, usage.get("output_tokens") or 0,
                         details.get("cached_tokens"))
        elif kind == "error":
            stream.error(event)
        elif kind == "response.failed":
            stream.error(((event.get("response") or {}).get("error")) or "response.failed")
        elif event.get("error"):  # an error body
            stream.error(event["error"])


class OllamaApi(OpenAIApi):
    """Ollama's ``/api/chat`` (or raw ``/api/generate`` for ``--endpoint completions``): the
    OpenAI request translated (`api_ollama.payload`), its NDJSON lines read as the OpenAI
    events they stand for (`api_ollama.event`)."""

    parse = staticmethod(api_ollama.event)
    finalize = staticmethod(api_ollama.payload)

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.path = api_ollama.path(self.chat)


class MessagesApi:
    """Anthropic's ``/v1/messages`` (`api_messages`): typed SSE events, usage in
    ``message_start`` / ``message_delta``, the end at ``message_stop``."""

    path = api_messages.PATH
    parse = staticmethod(sse_event)
    finalize = staticmethod(lambda body: body)

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def payload(self, history: list[dict], max_tokens: int) -> dict:
        return api_messages.payload(history, max_tokens, None, self.args)

    def read(self, event: dict, stream, start: float, now: float) -> None:
        api_messages.on_event(event, stream, now, start)
