"""What a tool-call format is to the shared parser (`tool_calls.ToolCallParser`), and the helpers
the formats are built from.

A format finds *blocks* in the output: an opening (``find_open``), the block's end
(a `Closer`) and the calls its body holds (``parse``, None when it holds none: the block is
then kept as content). Two shapes cover the formats models are trained on:

* `TaggedFormat`: a start marker anywhere in the output opens a block (``<tool_call>``,
  ``[TOOL_CALLS]``, ``functools``, ``<｜tool▁calls▁begin｜>``);
* `LeadingFormat`: the output *is* the calls: a block opens only where the output starts (after
  whitespace and optional markers) or right after a call; once anything else is seen, the rest
  is text (Llama 3 JSON, pythonic lists).

NOTE: streaming equals whole-output parsing only because every decision here is prefix-stable:
once ``find_open`` or a block's `Closer` gives an answer for a text, any longer text gives the
same one.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from radixserve.frontend.parsers.reasoning import split_partial_tag

__all__ = [
    "Calls",
    "LeadingFormat",
    "Span",
    "TaggedFormat",
    "ToolFormat",
    "Until",
    "array_calls",
    "json_call",
    "load_json",
    "object_call",
    "tiling_matches",
    "until",
]

Calls = list[tuple[str, str]]
"""Parsed calls in order: (name, arguments as a JSON object string)."""

Closer = Callable[[str], tuple[int, int] | None]
"""Finds the end of one block in its body (the text after the opening): (body_end,
block_end), the body being ``body[:body_end]`` and the block's raw text ending at
``block_end``; None while it is open (at the end of the output the block runs to the end).
Called with the body as it grows, each text extending the last, so it may resume its scan."""


@dataclass(slots=True, frozen=True)
class Span:
    """A block opening in a text: its raw text starts at ``start``, its body at ``body``."""

    start: int
    body: int


class ToolFormat(Protocol):
    is_leading: bool
    """True: blocks only open at the output's start or right after a call (`LeadingFormat`)."""
    markers: tuple[str, ...]
    """The format's marker tokens; where they are special tokens, the server decodes them as
    text (`Tokenizer.decode_as_text`) so that the parser sees them."""

    def find_open(self, text: str) -> Span | int:
        """The first block opening in `text`, or else how many leading characters are certainly
        text (the rest could still open a block). A leading format answers 0 (wait) or
        ``len(text)`` (no block)."""
        ...

    def closer(self) -> Closer:
        """A fresh `Closer` for a block that has just opened."""
        ...

    def parse(self, body: str) -> Calls | None:
        """The calls of a block body; None if it holds none (malformed, empty, wrong shape)."""
        ...


@dataclass(slots=True)
class Until:
    """`Closer` of a body ended by a fixed marker."""

    end: str
    _scan_from: int = 0

    def __call__(self, body: str) -> tuple[int, int] | None:
        at = body.find(self.end, self._scan_from)
        if at < 0:
            self._scan_from = max(0, len(body) - len(self.end) + 1)
            return None
        return at, at + len(self.end)


@dataclass(slots=True, frozen=True)
class TaggedFormat:
    """Blocks opened by ``start`` anywhere in the output; ``close`` (a `Closer` factory) and
    ``parse`` see the text after it."""

    start: str
    close: Callable[[], Closer]
    parse: Callable[[str], Calls | None]
    markers: tuple[str, ...] = ()
    is_leading: bool = False

    def find_open(self, text: str) -> Span | int:
        at = text.find(self.start)
        if at >= 0:
            return Span(at, at + len(self.start))
        return len(split_partial_tag(text, self.start)[0])

    def closer(self) -> Closer:
        return self.close()


@dataclass(slots=True, frozen=True)
class LeadingFormat:
    """Blocks that open only at a call position (the output's start or right after a call):
    whitespace, each of ``prefixes`` optionally (in order, whitespace after each), then
    ``opener``, the body's first character. Whatever else is seen there makes the rest text."""

    opener: str
    prefixes: tuple[str, ...]
    close: Callable[[], Closer]
    parse: Callable[[str], Calls | None]
    markers: tuple[str, ...] = ()
    is_leading: bool = True

    def find_open(self, text: str) -> Span | int:
        at = _skip_space(text, 0)
        for marker in self.prefixes:
            if text.startswith(marker, at):
                at = _skip_space(text, at + len(marker))
            elif at < len(text) and marker.startswith(text[at:]):
                return 0  # a marker may be arriving
        if at == len(text):
            return 0
        return Span(0, at) if text.startswith(self.opener, at) else len(text)

    def closer(self) -> Closer:
        return self.close()


def until(end: str) -> Callable[[], Closer]:
    """The `Closer` factory of bodies ended by the marker `end`."""
    return functools.partial(Until, end)


def _skip_space(text: str, at: int) -> int:
    return len(text) - len(text[at:].lstrip())


_STRUCTURE = {quotes: re.compile("[" + re.escape("[]{}\\" + quotes) + "]")
              for quotes in ('"', "\"'")}


@dataclass(slots=True)
class BracketScanner:
    """Finds the end of the bracketed value opening at ``text[start]`` (``[`` or ``{``), whose
    strings are quoted with any of `quotes` and backslash-escaped. Brackets are only counted (a
    ``[`` closed by ``}`` ends it too: parsing rejects it). Resumable: call it with the text as
    it grows; it answers the index just past the value, or None while the value is open."""

    start: int = 0
    quotes: str = '"'
    _at: int | None = None
    _depth: int = 0
    _quote: str = ""
    _end: int | None = None

    def __call__(self, text: str) -> int | None:
        if self._end is not None:
            return self._end
        pattern = _STRUCTURE[self.quotes]
        at = self.start if self._at is None else self._at
        while (found := pattern.search(text, at)) is not None:
            char, at = found.group(), found.end()
            if self._quote:
                if char == "\\":
                    at += 1
                elif char == self._quote:
                    self._quote = ""
            elif char in self.quotes:
                self._quote = char
            elif char in "[{":
                self._depth += 1
            elif char in "]}":
                self._depth -= 1
                if self._depth <= 0:
                    self._end = at
                    return at
        self._at = at
        return None


@dataclass(slots=True)
class JsonValueCloser:
    """`Closer` of a body that is one JSON array or object after optional whitespace; any
    other first character closes an empty block at once (it holds no call). ``quotes``: as in
    `BracketScanner` (Python literals quote with either)."""

    quotes: str = '"'
    _scanner: BracketScanner | None = None

    def __call__(self, body: str) -> tuple[int, int] | None:
        if self._scanner is None:
            at = _skip_space(body, 0)
            if at == len(body):
                return None
            if body[at] not in "[{":
                return 0, 0
            self._scanner = BracketScanner(at, self.quotes)
        end = self._scanner(body)
        return None if end is None else (end, end)


def json_call(obj: object, keys: tuple[str, ...] = ("arguments",)) -> tuple[str, str] | None:
    """(name, arguments) of ``{"name": str, KEY: object}``, KEY the first of `keys` present
    (none present: ``{}``); None for any other shape."""
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    arguments = next((obj[key] for key in keys if key in obj), {})
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return name, json.dumps(arguments, ensure_ascii=False)


def load_json(text: str) -> object:
    """``json.loads``, or None when `text` is not JSON (or nests too deep)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def object_call(text: str, keys: tuple[str, ...] = ("arguments",)) -> Calls | None:
    """The one call of a JSON call object (`json_call`), or None."""
    call = json_call(load_json(text), keys)
    return None if call is None else [call]


def array_calls(text: str, keys: tuple[str, ...] = ("arguments",)) -> Calls | None:
    """The calls of a non-empty JSON array of call objects (all must be calls), or None."""
    value = load_json(text)
    if not isinstance(value, list) or not value:
        return None
    calls = []
    for item in value:
        if (call := json_call(item, keys)) is None:
            return None
        calls.append(call)
    return calls


def tiling_matches(pattern: re.Pattern[str], text: str) -> list[re.Match[str]] | None:
    """The matches of `pattern`, one after another, that cover `text` exactly ([] for ""), or
    None if they do not."""
    matches, at = [], 0
    while at < len(text):
        found = pattern.match(text, at)
        if found is None or found.end() == at:
            return None
        matches.append(found)
        at = found.end()
    return matches
