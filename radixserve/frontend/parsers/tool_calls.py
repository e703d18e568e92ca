"""Parse Hermes-style tool calls (Hermes 2 Pro, Qwen2.5, Qwen3) from a model's output.

The model writes zero or more blocks
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, possibly after (or between)
ordinary text. Rules, shared by `ToolCallParser.extract` and the
streaming `ToolCallStream`:

* a block runs from a start tag to the first end tag after it, or to the end of the text;
* a block is a call iff its body is a JSON object with a non-empty string ``"name"`` and an
  ``"arguments"`` object (absent means ``{}``); its arguments string is
  ``json.dumps(arguments, ensure_ascii=False)``. Any other block (malformed JSON, wrong shape,
  unterminated and incomplete) is kept verbatim as content;
* content is the text outside calls, less the whitespace that only separates a call from the
  start or end of the output (the usual newlines around blocks); whitespace between two pieces
  of text stays, even with calls in it. It is None when empty, as OpenAI returns with calls.

Streaming choice: a call is only emitted once its block is complete (end tag or end of stream),
because until then the body may still turn out malformed, and a tool-call delta cannot be taken
back. It goes out as two OpenAI-shaped deltas: a header (index, id, name, ``""``) and the whole
arguments string as one fragment. Content before a block streams as it arrives.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from radixserve.frontend.parsers.reasoning import BoundaryTrimmer, split_partial_tag, trim_at_marks

__all__ = [
    "StreamDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "ToolCallStream",
    "make_call_id",
]

START_TAG = "<tool_call>"
END_TAG = "</tool_call>"


def make_call_id() -> str:
    """A fresh OpenAI-style call id: ``"call_"`` and 24 random hex digits."""
    return "call_" + secrets.token_hex(12)


@dataclass(slots=True)
class ToolCall:
    """One parsed call; ``arguments`` is a JSON object serialised as a string, as in OpenAI."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class ToolCallDelta:
    """One streaming ``tool_calls`` entry: the first for a call carries id and name."""

    index: int
    id: str | None
    name: str | None
    arguments_delta: str


StreamDelta = str | ToolCallDelta
"""A streaming item: content text (never empty) or a tool-call delta."""


def parse_call_body(body: str) -> tuple[str, str] | None:
    """Return (name, arguments JSON string) of a block body, or None if it is not a call."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    arguments = obj.get("arguments", {})
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return name, json.dumps(arguments, ensure_ascii=False)


@dataclass(slots=True, frozen=True)
class ToolCallParser:
    """Hermes tool-call parser (see the module docstring for the rules).

    ``id_factory`` makes each call's id, called once per parsed call in output order; inject a
    deterministic one in tests. Shareable; `new_stream()` gives the per-request state.
    """

    id_factory: Callable[[], str] = make_call_id

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """Return (content, tool_calls) of a whole output; content is None when empty."""
        pieces: list[str] = []
        calls: list[ToolCall] = []
        cuts: list[int] = []
        length = 0
        for item in self._segments(text):
            if isinstance(item, str):
                pieces.append(item)
                length += len(item)
            else:
                cuts.append(length)
                calls.append(ToolCall(self.id_factory(), *item))
        return trim_at_marks("".join(pieces), cuts) or None, calls

    def new_stream(self) -> ToolCallStream:
        """Fresh streaming state for one request."""
        return ToolCallStream(self)

    @staticmethod
    def _segments(text: str) -> Iterator[str | tuple[str, str]]:
        """Yield the text in order: plain text as str, each valid call as (name, arguments)."""
        pos = 0
        while (start := text.find(START_TAG, pos)) >= 0:
            yield text[pos:start]
            body_start = start + len(START_TAG)
            end = text.find(END_TAG, body_start)
            stop = len(text) if end < 0 else end
            parsed = parse_call_body(text[body_start:stop])
            block_end = len(text) if end < 0 else end + len(END_TAG)
            yield parsed if parsed is not None else text[start:block_end]
            pos = block_end
        yield text[pos:]


@dataclass(slots=True)
class ToolCallStream:
    """Per-request incremental `ToolCallParser`.

    Contract: for any split of a text into deltas, with the same ``id_factory`` sequence,

    * the concatenated content strings of every `feed` result and `finish()` equal
      ``extract(text)[0] or ""``;
    * grouping the `ToolCallDelta`s by index, taking id and name from the first and
      concatenating ``arguments_delta``, gives ``extract(text)[1]``;
    * after `finish()`, `finish_reason` is "tool_calls" iff there was a call.
    """

    parser: ToolCallParser
    _buffer: str = ""
    _in_block: bool = False
    _scan_from: int = 0
    _num_calls: int = 0
    _finished: bool = False
    _content: BoundaryTrimmer = field(default_factory=BoundaryTrimmer)

    @property
    def has_tool_calls(self) -> bool:
        """Whether at least one call has been emitted."""
        return self._num_calls > 0

    @property
    def finish_reason(self) -> str | None:
        """The reason to report: "tool_calls" once a call was emitted, else None (the engine's)."""
        return "tool_calls" if self._num_calls else None

    def feed(self, delta: str) -> list[StreamDelta]:
        """Add `delta`; return the content strings and tool-call deltas now decided."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buffer += delta
        out: list[StreamDelta] = []
        while self._step(out):
            pass
        return out

    def finish(self) -> list[StreamDelta]:
        """End the stream: close an open block, flush held text and trailing whitespace."""
        if self._finished:
            raise RuntimeError("finish() called twice")
        self._finished = True
        out: list[StreamDelta] = []
        if self._in_block:
            self._close_block(self._buffer, START_TAG + self._buffer, out)
        else:
            self._emit_text(self._buffer, out)
        self._buffer = ""
        self._emit(self._content.close(), out)
        return out

    def _step(self, out: list[StreamDelta]) -> bool:
        """Consume what the buffer decides; return True if a tag was found (scan again)."""
        if self._in_block:
            end = self._buffer.find(END_TAG, self._scan_from)
            if end < 0:
                self._scan_from = max(0, len(self._buffer) - len(END_TAG) + 1)
                return False
            body, self._buffer = self._buffer[:end], self._buffer[end + len(END_TAG) :]
            self._close_block(body, START_TAG + body + END_TAG, out)
            return True
        start = self._buffer.find(START_TAG)
        if start < 0:
            safe, self._buffer = split_partial_tag(self._buffer, START_TAG)
            self._emit_text(safe, out)
            return False
        self._emit_text(self._buffer[:start], out)
        self._buffer = self._buffer[start + len(START_TAG) :]
        self._in_block, self._scan_from = True, 0
        return True

    def _close_block(self, body: str, raw: str, out: list[StreamDelta]) -> None:
        """Emit a finished block: a call if its body parses, else `raw` as content."""
        self._in_block = False
        parsed = parse_call_body(body)
        if parsed is None:
            self._emit_text(raw, out)
            return
        name, arguments = parsed
        self._content.mark()
        index = self._num_calls
        self._num_calls += 1
        out.append(ToolCallDelta(index, self.parser.id_factory(), name, ""))
        out.append(ToolCallDelta(index, None, None, arguments))

    def _emit_text(self, text: str, out: list[StreamDelta]) -> None:
        self._emit(self._content.push(text), out)

    @staticmethod
    def _emit(text: str, out: list[StreamDelta]) -> None:
        if not text:
            return
        if out and isinstance(out[-1], str):
            out[-1] += text
        else:
            out.append(text)
