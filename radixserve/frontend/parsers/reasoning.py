"""Split a model's ``<think>...</think>`` reasoning from its answer, whole or streamed.

Qwen3 and DeepSeek-R1 style models write their chain of thought between a start and an end tag
before the answer. Either the model writes the start tag itself, or the chat template has already
opened the block in the prompt (``starts_in_reasoning``), so the output begins inside it.

Rules, shared by `ReasoningParser.extract` and the streaming `ReasoningStream`:

* the output enters reasoning if it begins with the start tag (exactly, no leading whitespace),
  or always when ``starts_in_reasoning`` (a start tag at the very beginning is then consumed);
* reasoning runs up to the first end tag, or to the end of the text if there is none;
* the reasoning text is stripped of surrounding whitespace; the content after the end tag is
  stripped of leading whitespace ("<think>\\nx\\n</think>\\n\\nHi" -> reasoning "x", content "Hi");
* an output that never enters reasoning is all content, unchanged; tags inside content are text.

The text helpers here (`split_partial_tag`, `trim_at_marks`, `BoundaryTrimmer`) are shared
with the tool call parser.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

__all__ = [
    "BoundaryTrimmer",
    "ReasoningParser",
    "ReasoningStream",
    "split_partial_tag",
    "trim_at_marks",
]


def split_partial_tag(text: str, tag: str) -> tuple[str, str]:
    """Split `text` into (safe, held), `held` its longest suffix that is a proper prefix of `tag`.

    `safe` cannot contain the start of an occurrence of `tag` that more text could complete,
    unless `text` already contains `tag` in full (callers search for the full tag first).
    """
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:n]):
            return text[:-n], text[-n:]
    return text, ""


def trim_at_marks(text: str, marks: list[int]) -> str:
    """Reference for `BoundaryTrimmer`: strip `text`'s leading (trailing) whitespace run iff a
    mark (an offset into `text` where something was cut out) lies in it or at its edge."""
    lead = len(text) - len(text.lstrip())
    if any(m <= lead for m in marks):
        text, marks = text[lead:], [m - lead for m in marks]
    tail = len(text.rstrip())
    if any(m >= tail for m in marks):
        text = text[:tail]
    return text


@dataclass(slots=True)
class BoundaryTrimmer:
    """Streams a text piece by piece, removing whitespace that only separates a cut from an end.

    A cut (`mark()`) is where something was taken out of the text: a tag, a tool call. Contract:
    the concatenation of every `push` result and `close()` equals ``trim_at_marks(pieces, cuts)``:
    whitespace between a cut and the start or end of the text goes, whitespace between two
    pieces of real text stays. Trailing whitespace is held back until that is decided.
    """

    pending: str = ""
    seen_text: bool = False
    marked: bool = False

    def mark(self) -> None:
        """Record a cut at the current end of the text."""
        self.marked = True

    def push(self, piece: str) -> str:
        """Add `piece`; return the text now certain to be kept."""
        run = self.pending + piece
        core = run.rstrip()
        if not core:
            self.pending = run
            return ""
        self.pending = run[len(core) :]
        if self.marked and not self.seen_text:
            core = core.lstrip()
        self.seen_text, self.marked = True, False
        return core

    def close(self) -> str:
        """End the text; return the held trailing whitespace unless a cut lies in it."""
        out = "" if self.marked else self.pending
        self.pending = ""
        return out


@dataclass(slots=True, frozen=True)
class ReasoningParser:
    """Separates ``reasoning_content`` from ``content`` (see the module docstring for the rules).

    Stateless and shareable; `new_stream()` gives the per-request streaming state.
    """

    start_tag: str = "<think>"
    end_tag: str = "</think>"
    starts_in_reasoning: bool = False
    markers: tuple[str, ...] = ()
    """The special tokens the tags are spelled with, where a tag is not one token itself
    (Gemma 4's ``<|channel>thought``: ``<|channel>``); the server decodes them as text. Empty:
    the tags themselves."""

    def __post_init__(self) -> None:
        if not self.start_tag or not self.end_tag:
            raise ValueError("reasoning start_tag and end_tag must be non-empty")

    def extract(self, text: str) -> tuple[str | None, str]:
        """Return (reasoning_content, content) of a whole output.

        ``reasoning_content`` is None iff the output never entered reasoning; it is "" for an
        empty block. ``content`` is "" when nothing follows the reasoning.
        """
        if text.startswith(self.start_tag):
            body = text[len(self.start_tag) :]
        elif self.starts_in_reasoning:
            body = text
        else:
            return None, text
        reasoning, found_end, content = body.partition(self.end_tag)
        return reasoning.strip(), content.lstrip() if found_end else ""

    def new_stream(self) -> ReasoningStream:
        """Fresh streaming state for one request."""
        return ReasoningStream(self)

    def for_prompt(self, prompt: str) -> ReasoningParser:
        """This parser for the output that continues `prompt`: one that starts in reasoning
        when the prompt ends (whitespace aside) with the start tag (the template opened the
        block: Qwen3.5, Nemotron, GLM-4.7 thinking), one that does not when it ends with the
        end tag (thinking turned off: ``<think>\\n\\n</think>\\n\\n``, GLM's ``</think>``),
        else this one. Pure: returns a parser, never changes this one."""
        tail = prompt.rstrip()
        if tail.endswith(self.start_tag):
            opened = True
        elif tail.endswith(self.end_tag):
            opened = False
        else:
            return self
        if opened == self.starts_in_reasoning:
            return self
        return dataclasses.replace(self, starts_in_reasoning=opened)


_PREFIX, _REASONING, _CONTENT = "prefix", "reasoning", "content"


@dataclass(slots=True)
class ReasoningStream:
    """Per-request incremental `ReasoningParser`.

    Contract: for any split of a text into deltas, concatenating the reasoning (content) parts
    of every `feed` result and of `finish()` equals ``extract(text)[0] or ""``
    (``extract(text)[1]``), and after `finish()` `entered_reasoning` equals
    ``extract(text)[0] is not None``. Text that may be part of a tag, or whitespace that may
    turn out to be trailing, is held back until decided.
    """

    parser: ReasoningParser
    _state: str = _PREFIX
    _held: str = ""
    _finished: bool = False
    _entered: bool = False
    _reasoning: BoundaryTrimmer = field(default_factory=BoundaryTrimmer)
    _content: BoundaryTrimmer = field(default_factory=BoundaryTrimmer)

    @property
    def entered_reasoning(self) -> bool:
        """Whether the output is known to have entered reasoning (``reasoning_content`` set)."""
        return self._entered

    def feed(self, delta: str) -> tuple[str, str]:
        """Add `delta`; return the (reasoning_delta, content_delta) now decided ("" for none)."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._held += delta
        return self._advance(final=False)

    def finish(self) -> tuple[str, str]:
        """End the stream; return the held-back (reasoning_delta, content_delta)."""
        if self._finished:
            raise RuntimeError("finish() called twice")
        self._finished = True
        return self._advance(final=True)

    def _advance(self, final: bool) -> tuple[str, str]:
        text, self._held = self._held, ""
        if self._state == _PREFIX:
            text = self._resolve_prefix(text, final)
            if self._state == _PREFIX:
                return "", ""
        if self._state == _REASONING:
            return self._advance_reasoning(text, final)
        return "", self._push_content(text, final)

    def _resolve_prefix(self, text: str, final: bool) -> str:
        """Decide whether the output opens a reasoning block; return the text left to route."""
        start = self.parser.start_tag
        if text.startswith(start):
            self._enter_reasoning()
            return text[len(start) :]
        if start.startswith(text) and not final:
            self._held = text
            return ""
        if self.parser.starts_in_reasoning:
            self._enter_reasoning()
        else:
            self._state = _CONTENT
        return text

    def _enter_reasoning(self) -> None:
        self._state, self._entered = _REASONING, True
        self._reasoning.mark()

    def _advance_reasoning(self, text: str, final: bool) -> tuple[str, str]:
        """Route `text` in reasoning: up to an end tag, holding back a possible partial one."""
        before, found_end, after = text.partition(self.parser.end_tag)
        if not found_end and not final:
            safe, self._held = split_partial_tag(text, self.parser.end_tag)
            return self._reasoning.push(safe), ""
        reasoning = self._reasoning.push(before)
        self._reasoning.mark()
        reasoning += self._reasoning.close()
        self._state = _CONTENT
        self._content.mark()
        return reasoning, self._push_content(after, final)

    def _push_content(self, text: str, final: bool) -> str:
        content = self._content.push(text)
        return content + self._content.close() if final else content
