"""Ollama's /api/chat and /api/generate on top of the OpenAI handlers (no second generation
path): the Ollama request becomes the equivalent /v1/chat/completions request (or, for
``/api/generate`` with ``raw``, a /v1/completions one), runs through `OpenAIRoutes`'s own
handler (template, tokenizer, parsers, structured output, admission, engine), and its answer,
whole or streamed, is rewritten in Ollama's shape: one JSON object, or NDJSON lines ending
with a ``done: true`` line carrying the counts and durations (nanoseconds).

Streamed = whole: the streamed lines' contents add up to the whole answer's, because both
come from the same handler's streamed and whole answers, which agree.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import AsyncIterator

import msgspec

from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.tokenizer.fim_prompt import fim_prompt_ids

_FINISH = {"stop": "stop", "length": "length", "tool_calls": "stop", "abort": "stop"}


class OllamaStreamError(Exception):
    """An error event inside the OpenAI stream (sent as an ``{"error": ...}`` line)."""


def now_rfc3339() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat().replace("+00:00", "Z")


def _arguments(text: str) -> dict:
    """Ollama carries tool arguments as an object; the model wrote JSON text."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {"_raw": text}
    return value if isinstance(value, dict) else {"_value": value}


class Context:
    """Ollama's ``context`` of /api/generate: the token ids of the conversation so far (the
    context sent, the prompt as the model read it, then the answer), for the client to send
    back with its next prompt. The answer's ids are its text encoded again (the stream carries
    text), which reads the same to the model."""

    def __init__(self, prompt_ids: list[int], encode) -> None:
        self.prompt_ids, self.encode = prompt_ids, encode

    def after(self, text: str) -> list[int]:
        return self.prompt_ids + (self.encode(text, add_special_tokens=False) if text else [])


class Shape:
    """How one Ollama route writes an answer: /api/chat nests a ``message``, /api/generate
    has a flat ``response`` (and ``thinking``)."""

    def __init__(self, model: str, is_chat: bool, arrival: float) -> None:
        self.model, self.is_chat, self.arrival = model, is_chat, arrival
        self.context: Context | None = None  # /api/generate's: the conversation's tokens

    def part(self, content: str = "", thinking: str | None = None,
             tool_calls: list | None = None) -> dict:
        out: dict = {"model": self.model, "created_at": now_rfc3339()}
        if self.is_chat:
            message: dict = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if tool_calls:
                message["tool_calls"] = tool_calls
            out["message"] = message
        else:
            out["response"] = content
            if thinking:
                out["thinking"] = thinking
        out["done"] = False
        return out

    def done(self, part: dict, reason: str | None, usage: dict | None,
             first_time: float | None, text: str = "") -> dict:
        """The last line: ``part`` with the finish reason, the counts and timings, and (on
        /api/generate) the ``context`` after ``text``, the whole answer."""
        end = time.time()
        first = first_time or end
        usage = usage or {}
        part.update(done=True, done_reason=_FINISH.get(reason or "stop", reason),
                    total_duration=_ns(end - self.arrival), load_duration=0,
                    prompt_eval_count=usage.get("prompt_tokens", 0),
                    prompt_eval_duration=_ns(first - self.arrival),
                    eval_count=usage.get("completion_tokens", 0),
                    eval_duration=_ns(end - first))
        if self.context is not None:
            part["context"] = self.context.after(text)
        return part

    def loaded(self) -> dict:
        """The answer to an empty request: Ollama's "load the model" call."""
        part = self.part()
        part.update(done=True, done_reason="load")
        return part


def _ns(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


def whole(shape: Shape, answer: bytes) -> bytes:
    """A whole OpenAI chat or completion answer in Ollama's shape."""
    data = json.loads(answer)
    choice = data["choices"][0]
    if "message" in choice:  # a chat answer (for /api/chat, or /api/generate's prompt)
        msg = choice["message"]
        calls = [{"function": {"name": c["function"]["name"],
                               "arguments": _arguments(c["function"]["arguments"])}}
                 for c in msg.get("tool_calls") or ()]
        part = shape.part(msg.get("content") or "", msg.get("reasoning_content"), calls)
    else:
        part = shape.part(choice["text"])
    return msgspec.json.encode(shape.done(part, choice.get("finish_reason"), data.get("usage"),
                                          None, part.get("response", "")))


async def stream(shape: Shape, chunks: AsyncIterator[str]) -> AsyncIterator[bytes]:
    """An OpenAI SSE stream (``stream_options.include_usage`` set) as Ollama NDJSON lines;
    tool calls (streamed as argument pieces) go out whole in one line before the last. A
    progress chunk (``return_progress``) becomes a line with empty content and its
    ``prompt_progress``."""
    reason, usage, first = None, None, None
    texts: list[str] = []  # /api/generate's answer, for its context
    calls: dict[int, dict] = {}
    decode = msgspec.json.decode
    async for chunk in chunks:
        lines = []
        for event in chunk.split("\n\n"):
            if not event.startswith("data: "):
                continue
            payload = event[6:]
            if payload == "[DONE]":
                break
            data = decode(payload)
            if "error" in data:
                raise OllamaStreamError(data["error"].get("message", "error"))
            if data.get("usage"):
                usage = data["usage"]
            if "prompt_progress" in data:  # asked for (return_progress): no text
                lines.append(shape.part() | {"prompt_progress": data["prompt_progress"]})
                continue
            for choice in data.get("choices") or ():
                reason = choice.get("finish_reason") or reason
                if "delta" in choice:  # a chat stream
                    delta = choice["delta"]
                    text, thinking = delta.get("content") or "", delta.get("reasoning_content")
                    for tc in delta.get("tool_calls") or ():
                        call = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
                        fn = tc.get("function") or {}
                        call["name"] += fn.get("name") or ""
                        call["arguments"] += fn.get("arguments") or ""
                else:
                    text, thinking = choice.get("text") or "", None
                texts.append(text)
                if text or thinking:
                    first = first or time.time()
                    lines.append(shape.part(text, thinking))
                if calls and not shape.is_chat:
                    raise OllamaStreamError("tool calls need /api/chat")
        if lines:
            yield b"".join(msgspec.json.encode(line) + b"\n" for line in lines)
    if calls:
        yield msgspec.json.encode(shape.part(tool_calls=[
            {"function": {"name": c["name"], "arguments": _arguments(c["arguments"])}}
            for _, c in sorted(calls.items())])) + b"\n"
    yield msgspec.json.encode(shape.done(shape.part(), reason, usage, first,
                                         "".join(texts))) + b"\n"


async def collect(lines: AsyncIterator[bytes]) -> bytes:
    """`stream`'s NDJSON lines joined into the one answer of ``stream: false``: the text (and
    thinking) concatenated, the tool calls, and the last line's done fields and timings."""
    key, text, thinking, calls, last = "response", [], [], [], {}
    async for chunk in lines:
        for line in chunk.splitlines():
            last = msgspec.json.decode(line)
            body = last.get("message", last)  # /api/chat nests it, /api/generate is flat
            key = "content" if "message" in last else "response"
            text.append(body.get(key) or "")
            thinking.append(body.get("thinking") or "")
            calls += body.get("tool_calls") or []
    body = last.get("message", last)
    body[key] = "".join(text)
    if any(thinking):
        body["thinking"] = "".join(thinking)
    if calls:
        body["tool_calls"] = calls
    return msgspec.json.encode(last)


def fim_prompt(tokenizer, model: str, prompt: str, suffix: str) -> list[int]:
    """/api/generate's ``suffix`` prompt: ``prompt`` filled in before ``suffix``; Ollama's
    400 for a model that cannot (``... does not support insert``), saying why."""
    try:
        return fim_prompt_ids(tokenizer, prompt, suffix)
    except ValueError as exc:
        raise OpenAIError(f"{model} does not support insert: {exc}") from None


def check_model(names: set[str], model: str) -> None:
    if model not in names:
        raise OpenAIError(f"model '{model}' not found", 404)
