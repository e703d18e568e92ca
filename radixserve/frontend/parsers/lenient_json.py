"""Tool calls a small model writes as plain JSON instead of in its template's format.

Offered tools, a small model (Qwen2.5-Coder-1.5B: tests/recorded/) often answers
with the call without the template's tags: in a fenced block (```json ... ```), bare, or in
the form its template shows as the example, ``{{"name": ..., "arguments": ...}}`` (Qwen2.5's
escapes its braces so: a model copies the escape, on the outer braces alone or on every
pair, ``{{"name": "f", "arguments": {"x": 1}}}}``). llama.cpp reads these for Qwen2.5-Coder; so does `LenientToolParser`,
around the format's own parser, for a request that offers tools (``tool_choice`` not
``"none"``). The answer is calls when:

* the format's parser finds none in it (an answer with calls in the format is its answer);
* the WHOLE answer, whitespace aside, is JSON values one after another (each an object or an
  array of objects), bare or in one fenced block (info ``json`` or none; a fence that the end
  of the output leaves open is accepted); an answer whose first value opens with ``{{`` is
  read with its doubled braces as single ones (`_unescape_braces`, str.format's escape);
* every object is a call: ``{"name", "arguments"}`` (``"parameters"`` too), optionally
  wrapped as ``{"function": {...}}`` or marked ``"type": "function"``, arguments an object or
  a string holding one (the double-encoded form an old history taught); no other keys;
* every call names an offered tool, its arguments valid for that tool's parameters schema
  (structured/schema_check.py), and there is one call unless parallel calls are allowed.

Anything else is the format parser's answer, as without this parser.

Streaming (`LenientToolStream`) holds back an answer while it may still become such calls:
from its first character (``{``, ``[`` or a fence) until it cannot (`_Shape.read`: a decision
that a longer text never reverses), then streams it through the format's parser; at the end,
an answer still held is read whole (`extract`), so the stream adds up to `extract`'s result.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from radixserve.frontend.parsers.tool_calls import (
    StreamDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallParser,
    ToolCallStream,
)
from radixserve.frontend.parsers.tool_format import BracketScanner, Calls, load_json
from radixserve.structured.schema_check import satisfies

__all__ = ["LenientToolParser", "LenientToolStream"]

_FENCE = "```"
_CALL_KEYS = {"name", "arguments", "parameters", "type", "id"}


@dataclass(slots=True, frozen=True)
class LenientToolParser:
    """The format's `ToolCallParser` (``inner``) and the JSON forms of the module docstring,
    for one request: ``tools`` maps each offered tool's name to its parameters schema (None:
    any object); ``parallel`` False allows one call. Same interface as `ToolCallParser`."""

    inner: ToolCallParser
    tools: Mapping[str, dict[str, Any] | None]
    parallel: bool = True

    @property
    def id_factory(self) -> Callable[[], str]:
        return self.inner.id_factory

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of a whole output; content is None when there are calls."""
        content, calls = self.inner.extract(text)
        if calls:
            return content, calls
        shape = _Shape(self)
        if not (shape.read(text) and shape.is_complete(text)):
            return content, calls
        return None, [ToolCall(self.id_factory(), name, args) for name, args in shape.calls]

    def new_stream(self) -> LenientToolStream:
        """Fresh streaming state for one request."""
        return LenientToolStream(self, self.inner.new_stream(), _Shape(self))

    def value_calls(self, text: str) -> Calls | None:
        """The calls of one complete JSON value's text, or None if it is not calls."""
        value = load_json(text)
        items = value if isinstance(value, list) else [value]
        calls = [self._call(item) for item in items]
        if not calls or None in calls:
            return None
        return calls  # type: ignore[return-value]

    def _call(self, item: Any) -> tuple[str, str] | None:
        if isinstance(item, dict) and isinstance(item.get("function"), dict):
            if not set(item) <= {"function", "type", "id"} or not _is_function(item):
                return None
            item = item["function"]
        if not isinstance(item, dict) or not set(item) <= _CALL_KEYS or not _is_function(item):
            return None
        name = item.get("name")
        if not isinstance(name, str) or name not in self.tools:
            return None
        arguments = next((item[key] for key in ("arguments", "parameters") if key in item), {})
        if isinstance(arguments, str):
            arguments = load_json(arguments)
        schema = self.tools[name]
        if not isinstance(arguments, dict) or schema and not satisfies(arguments, schema):
            return None
        return name, json.dumps(arguments, ensure_ascii=False)


def _is_function(item: dict) -> bool:
    return item.get("type", "function") == "function"


@dataclass(slots=True)
class _Shape:
    """Reads a growing answer in the lenient forms, resuming where it stopped.

    ``read(text)`` is False once no text starting with `text` can be calls (final: every later
    text gives False too), True while it still may be (``final``: `text` is the whole answer); ``is_complete`` then says whether
    `text` itself, as a whole answer, is calls (in ``calls``).
    """

    parser: LenientToolParser
    calls: Calls = field(default_factory=list)
    _escaped: bool | None = None  # braces doubled (``{{``): None until the first value shows
    _fenced: bool | None = None  # None until the first character is seen
    _at: int = 0  # where the next value (or the closing fence) may start
    _scanner: BracketScanner | None = None  # in a value
    _closed: bool = False  # past the closing fence

    def read(self, text: str, final: bool = False) -> bool:
        if self._fenced is None:
            opened = self._open(text)
            if opened is not True:
                return opened is None
        if self._escaped is None:  # `_at` is before the first value (a fence holds no braces)
            head = text[self._at :].lstrip()[:2]
            if head in ("", "{") and not final:  # the value has not shown how it opens yet
                return True
            self._escaped = head == "{{"
        if self._escaped:
            text = _unescape_braces(text, final)
        while True:
            if self._scanner is not None:
                end = self._scanner(text)
                if end is None:
                    return True
                if not self._add(text[self._scanner.start : end]):
                    return False
                self._at, self._scanner = end, None
            rest = text[self._at :].lstrip()
            if not rest or self._closed:
                return not rest
            at = len(text) - len(rest)
            if rest[0] in "{[":
                self._scanner = BracketScanner(at)
            elif self._fenced and self.calls and rest.startswith(_FENCE):
                self._at, self._closed = at + len(_FENCE), True
            else:
                return self._fenced is True and bool(self.calls) and _FENCE.startswith(rest)

    def is_complete(self, text: str) -> bool:
        """Whether `text`, which `read` accepted, is whole calls (not a value cut short)."""
        if self._escaped:  # the last brace, held back while it could pair, is read now
            if not self.read(text, final=True):
                return False
            text = _unescape_braces(text, final=True)
        return self._scanner is None and bool(self.calls) and not text[self._at :].strip()

    def _open(self, text: str) -> bool | None:
        """How the answer starts: True once known (``_fenced`` set, ``_at`` at its first value),
        None while a lenient form may still start, False if none can."""
        rest = text.lstrip()
        if rest[:1] in ("{", "["):
            self._fenced, self._at = False, len(text) - len(rest)
            return True
        if not rest.startswith(_FENCE):
            return None if _FENCE.startswith(rest) else False
        line_end = rest.find("\n")
        info = rest[len(_FENCE) : None if line_end < 0 else line_end].strip().lower()
        if line_end < 0:
            return None if "json".startswith(info) else False
        if info not in ("", "json"):
            return False
        self._fenced, self._at = True, len(text) - len(rest) + line_end + 1
        return True

    def _add(self, value: str) -> bool:
        calls = self.parser.value_calls(value)
        if calls is None:
            return False
        self.calls += calls
        return self.parser.parallel or len(self.calls) == 1


def _unescape_braces(text: str, final: bool = False) -> str:
    """`text` with ``{{`` / ``}}`` read as ``{`` / ``}``, pairing left to right. A last lone
    brace may still be half of a pair: held back unless `final`, so the result for a longer
    text always extends the result for a shorter one (the stream reads it resuming)."""
    out, i, n = [], 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "{}" and i + 1 < n and text[i + 1] == ch:
            out.append(ch)
            i += 2
            continue
        if ch in "{}" and i + 1 == n and not final:
            break
        out.append(ch)
        i += 1
    return "".join(out)


@dataclass(slots=True)
class LenientToolStream:
    """Per-request incremental `LenientToolParser`, with `ToolCallStream`'s contract: the
    content and calls it emits add up to ``extract`` of the whole text."""

    parser: LenientToolParser
    _inner: ToolCallStream
    _shape: _Shape | None  # None once the answer cannot be lenient calls
    _held: str = ""
    _num_calls: int = 0  # calls emitted from a held answer

    @property
    def has_tool_calls(self) -> bool:
        return self._num_calls > 0 or self._inner.has_tool_calls

    @property
    def finish_reason(self) -> str | None:
        return "tool_calls" if self.has_tool_calls else None

    def feed(self, delta: str) -> list[StreamDelta]:
        """Add `delta`; return the content and tool-call deltas now decided."""
        if self._shape is None:
            return self._inner.feed(delta)
        self._held += delta
        if self._shape.read(self._held):
            return []
        self._shape = None
        held, self._held = self._held, ""
        return self._inner.feed(held)

    def finish(self) -> list[StreamDelta]:
        """End the stream: a held answer is read whole, else the format's stream ends."""
        if self._shape is None:
            return self._inner.finish()
        self._shape = None
        content, calls = self.parser.extract(self._held)
        self._held = ""
        out: list[StreamDelta] = [content] if content else []
        for index, call in enumerate(calls):
            out.append(ToolCallDelta(index, call.id, call.name, ""))
            out.append(ToolCallDelta(index, None, None, call.arguments))
        self._num_calls = len(calls)
        return out
