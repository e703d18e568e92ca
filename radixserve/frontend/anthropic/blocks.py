"""The chat parsers' deltas as Anthropic content blocks: the stream's events and the whole list.

`BlockAssembler` takes the `DeltaMessage`s of the chat pipeline's per-sample parsers
(reasoning → ``thinking``, content → ``text``, tool calls → ``tool_use``) in order and opens
a new block whenever the kind changes (each tool call is its own block). The streamed and the
whole response are both built by it, from the same parser deltas, so a stream's blocks add up
to the whole response's for any chunking of the output.
"""

from __future__ import annotations

import json

import msgspec

from radixserve.frontend.output_processor import RequestState
from radixserve.frontend.openai.protocol_chat import DeltaMessage

_enc = msgspec.json.encode
PING = 'event: ping\ndata: {"type":"ping"}\n\n'
MESSAGE_STOP = 'event: message_stop\ndata: {"type":"message_stop"}\n\n'


def event(kind: str, payload: dict) -> str:
    """One SSE event: ``event: kind`` and ``payload`` (with its ``type``) as data."""
    return f"event: {kind}\ndata: {_enc({'type': kind, **payload}).decode()}\n\n"


class BlockAssembler:
    """Content blocks of one message. `add` and `close` return the SSE events they cause and
    update `blocks`; after `close`, `blocks` is the message's ``content``."""

    def __init__(self) -> None:
        self.blocks: list[dict] = []
        self._open: str | None = None  # the kind of the last block, while it is open
        self._json: list[str] = []  # the open tool_use block's input JSON, as streamed
        self._text_head = ""  # the open text/thinking block's delta event, up to the text
        self.has_tool_calls = False

    def add(self, delta: DeltaMessage) -> list[str]:
        out: list[str] = []
        if delta.reasoning_content:
            self._text(out, "thinking", delta.reasoning_content)
        if delta.content:
            self._text(out, "text", delta.content)
        for call in delta.tool_calls or ():
            if call.id is not None:  # a call's first piece: id and name
                self._start(out, "tool_use", {"type": "tool_use", "id": call.id,
                                              "name": call.function.name, "input": {}})
                self.has_tool_calls = True
            args = call.function.arguments if call.function else None
            if args:
                self._json.append(args)
                out.append(event("content_block_delta", {
                    "index": len(self.blocks) - 1,
                    "delta": {"type": "input_json_delta", "partial_json": args}}))
        return out

    def close(self) -> list[str]:
        """End the last block (call once, at the end of the output)."""
        out: list[str] = []
        self._stop(out)
        return out

    def _text(self, out: list[str], kind: str, text: str) -> None:
        if self._open != kind:
            self._start(out, kind, {"type": "text", "text": ""} if kind == "text"
                        else {"type": "thinking", "thinking": "", "signature": ""})
            delta_type = "text_delta" if kind == "text" else "thinking_delta"
            self._text_head = (
                f'event: content_block_delta\ndata: {{"type":"content_block_delta",'
                f'"index":{len(self.blocks) - 1},"delta":{{"type":"{delta_type}",'
                f'"{kind}":')
        self.blocks[-1][kind] += text
        out.append(f"{self._text_head}{_enc(text).decode()}}}}}\n\n")

    def _start(self, out: list[str], kind: str, block: dict) -> None:
        self._stop(out)
        out.append(event("content_block_start", {"index": len(self.blocks),
                                                 "content_block": block}))
        self.blocks.append(dict(block))
        self._open = kind

    def _stop(self, out: list[str]) -> None:
        if self._open is None:
            return
        if self._open == "tool_use":
            self.blocks[-1]["input"] = _tool_input("".join(self._json))
            self._json = []
        out.append(event("content_block_stop", {"index": len(self.blocks) - 1}))
        self._open = None


def _tool_input(arguments: str) -> dict:
    """A call's input object; {} when its arguments do not parse (a call cut by max_tokens)."""
    if not arguments:
        return {}
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def stop_reason(state: RequestState, has_tool_calls: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): ``max_tokens`` when the output was cut, ``tool_use`` when
    it called a tool, ``stop_sequence`` (with the matched string) for a stop string, else
    ``end_turn`` (an end-of-sequence or stop token)."""
    if state.finish_reason == "length":
        return "max_tokens", None
    if has_tool_calls:
        return "tool_use", None
    if isinstance(state.stop_reason, str):
        return "stop_sequence", state.stop_reason
    return "end_turn", None


def usage(num_prompt: int, state: RequestState | None) -> dict:
    """Anthropic usage: ``input_tokens`` are the prompt tokens not read from the prefix cache,
    ``cache_read_input_tokens`` those that were (their sum is the prompt's length)."""
    cached = state.num_cached_tokens if state is not None else 0
    return {"input_tokens": num_prompt - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
            "output_tokens": len(state.token_ids) if state is not None else 0}
