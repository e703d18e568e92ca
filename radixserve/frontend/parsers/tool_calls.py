"""Parse tool calls from a model's output, whole or streamed, in any `ToolFormat`.

The format (``tool_format.py``; one file per format, Hermes by default) finds blocks in the
output and the calls in each block. Rules, shared by `ToolCallParser.extract` and the
streaming `ToolCallStream`:

* a block runs from where the format opens it to where it closes it, or to the end of the text;
* a block holding calls gives them in order, each with its arguments string
  ``json.dumps(arguments, ensure_ascii=False)``; any other block (malformed, wrong shape,
  unterminated and incomplete) is kept verbatim as content. In a leading format (the output
  *is* the calls), such a block, or any text where a call could start, ends the calls: the rest
  is content;
* content is the text outside calls, less the whitespace that only separates a call from the
  start or end of the output (the usual newlines around blocks); whitespace between two pieces
  of text stays, even with calls in it. It is None when empty, as OpenAI returns with calls.

Streaming choice: a call is only emitted once its block is complete (closed or end of stream),
because until then the body may still turn out malformed, and a tool-call delta cannot be taken
back. It goes out as two OpenAI-shaped deltas: a header (index, id, name, ``""``) and the whole
arguments string as one fragment. Content before a block streams as it arrives.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from radixserve.frontend.parsers.hermes import FORMAT as HERMES
from radixserve.frontend.parsers.reasoning import BoundaryTrimmer, trim_at_marks
from radixserve.frontend.parsers.tool_format import Calls, Closer, ToolFormat

__all__ = [
    "StreamDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "ToolCallStream",
    "make_call_id",
]

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


@dataclass(slots=True, frozen=True)
class ToolCallParser:
    """Tool-call parser for one `ToolFormat` (see the module docstring for the rules).

    ``id_factory`` makes each call's id, called once per parsed call in output order; inject a
    deterministic one in tests. Shareable; `new_stream()` gives the per-request state.
    """

    id_factory: Callable[[], str] = make_call_id
    format: ToolFormat = HERMES

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
                calls.extend(ToolCall(self.id_factory(), *call) for call in item)
        return trim_at_marks("".join(pieces), cuts) or None, calls

    def new_stream(self) -> ToolCallStream:
        """Fresh streaming state for one request."""
        return ToolCallStream(self)

    def _segments(self, text: str) -> Iterator[str | Calls]:
        """Yield the text in order: plain text as str, each block's calls as a list."""
        fmt = self.format
        while text:
            found = fmt.find_open(text)
            if isinstance(found, int):
                break
            yield text[: found.start]
            body = text[found.body :]
            body_end, block_end = fmt.closer()(body) or (len(body), len(body))
            calls = fmt.parse(body[:body_end])
            block_end += found.body
            yield text[found.start : block_end] if calls is None else calls
            text = text[block_end:]
            if calls is None and fmt.is_leading:
                break
        yield text


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
    _body: int | None = None  # in a block: where its body starts in _buffer
    _closer: Closer | None = None  # in a block: finds its end
    _is_text: bool = False  # a leading format saw text: no block opens any more
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
        if self._body is not None:
            body_len = len(self._buffer) - self._body
            self._close_block(body_len, body_len, out)
        self._emit_text(self._buffer, out)
        self._buffer = ""
        self._emit(self._content.close(), out)
        return out

    def _step(self, out: list[StreamDelta]) -> bool:
        """Consume what the buffer decides; return True if a block opened or closed."""
        fmt = self.parser.format
        if self._is_text:
            self._emit_text(self._buffer, out)
            self._buffer = ""
            return False
        if self._body is None:
            found = fmt.find_open(self._buffer)
            if isinstance(found, int):
                self._emit_text(self._buffer[:found], out)
                self._buffer = self._buffer[found:]
                self._is_text = fmt.is_leading and found > 0
                return False
            self._emit_text(self._buffer[: found.start], out)
            self._buffer = self._buffer[found.start :]
            self._body, self._closer = found.body - found.start, fmt.closer()
            return True
        assert self._closer is not None
        closed = self._closer(self._buffer[self._body :])
        if closed is None:
            return False
        self._close_block(*closed, out)
        return True

    def _close_block(self, body_end: int, block_end: int, out: list[StreamDelta]) -> None:
        """Emit the open block: its calls if its body holds any, else its raw text."""
        assert self._body is not None
        start = self._body
        calls = self.parser.format.parse(self._buffer[start : start + body_end])
        raw, self._buffer = self._buffer[: start + block_end], self._buffer[start + block_end :]
        self._body = self._closer = None
        if calls is None:
            self._emit_text(raw, out)
            self._is_text = self.parser.format.is_leading
            return
        self._content.mark()
        for name, arguments in calls:
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
