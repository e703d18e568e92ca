"""OpenAI's harmony format (gpt-oss): messages on channels, whole or streamed.

After the prompt's ``<|start|>assistant`` the model writes one or more messages::

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>
    {"city": "Paris"}<|call|>

or ``...<|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>``. A message is a
header (``<|start|>`` role, ``<|channel|>`` name, an optional recipient ``to=...`` in the role
or the channel part, an optional content type) up to ``<|message|>``, then its text up to
``<|end|>``, ``<|call|>`` or ``<|return|>`` (the last two are stop tokens, so often absent), or
up to the next header. The two parsers the server chains read it so:

* `HarmonyReasoningParser` (the reasoning slot): ``analysis`` text is reasoning; ``final``
  text, ``commentary`` without a recipient (a preamble) and text outside any message are
  content; a message with a recipient goes on to the content verbatim, header and end marker
  included, for the tool-call parser. Headers and end markers are dropped; text is kept as
  written (no stripping). ``reasoning_content`` is None iff no analysis message was seen.
* `FORMAT` (the tool slot, a `ToolFormat` for `ToolCallParser`): a message whose recipient is
  ``functions.NAME`` is a call of NAME, its text the JSON arguments (an object; empty: ``{}``).
  Any other text, a malformed call included, is content as it stands. Without the reasoning
  parser it reads the raw output: calls are found, the rest stays raw.

Why not the ``openai-harmony`` package: it parses token ids of its own tiktoken vocabulary,
which it downloads at first use (a server here has no network, and a GGUF brings its own
vocabulary); it has no text API, and every endpoint here parses text with the markers kept
(`Tokenizer.decode_as_text`). Rendering is the model's own chat template.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from radixserve.frontend.parsers.tool_format import Calls, Span

__all__ = ["FORMAT", "MARKERS", "HarmonyFormat", "HarmonyReasoningParser", "HarmonyStream"]

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
END, CALL, RETURN, CONSTRAIN = "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"
MARKERS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL)
"""The harmony special tokens; the server decodes them as text so that the parsers see them."""

_ENDS = (END, CALL, RETURN)  # end a message, consumed
_OPENS = (START, CHANNEL)  # open a header (and end a message left without an end marker)
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL_NAME = re.compile(r"<\|channel\|>\s*(\w+)")
_FUNCTIONS = "functions."


def _first(text: str, markers: tuple[str, ...], at: int = 0) -> tuple[int, str] | None:
    """(index, marker) of the earliest of `markers` in ``text[at:]``, or None."""
    found = [(i, m) for m in markers if (i := text.find(m, at)) >= 0]
    return min(found) if found else None


def _safe_len(text: str, markers: tuple[str, ...]) -> int:
    """How much of `text` cannot be the start of one of `markers` that more text completes."""
    for start in range(max(0, len(text) - max(map(len, markers)) + 1), len(text)):
        tail = text[start:]
        if any(m.startswith(tail) for m in markers):
            return start
    return len(text)


def _header(raw: str) -> tuple[str | None, str | None]:
    """(channel, recipient) of a message header's raw text (either None when absent)."""
    channel, recipient = _CHANNEL_NAME.search(raw), _RECIPIENT.search(raw)
    return channel and channel[1], recipient and recipient[1]


def _function(header: str) -> str | None:
    """The function a header addresses (``to=functions.NAME``), or None."""
    recipient = _header(header)[1]
    if recipient is None or not recipient.startswith(_FUNCTIONS):
        return None
    return recipient[len(_FUNCTIONS) :] or None


# ------------------------------------------------------------------ reasoning slot

_OUT, _HEAD, _BODY = "out", "head", "body"
_REASONING, _CONTENT, _RAW = "reasoning", "content", "raw"


@dataclass(slots=True, frozen=True)
class HarmonyReasoningParser:
    """The reasoning slot's harmony parser (the module docstring's rules); same interface as
    `ReasoningParser`. ``start_tag`` and ``end_tag`` gate a structured-output constraint
    (`fanout.gate_on_reasoning`): the constraint starts with the final channel's text, and a
    prompt always ends opening an assistant message, after any earlier final one."""

    start_tag: str = START + "assistant"
    end_tag: str = CHANNEL + "final" + MESSAGE
    starts_in_reasoning: bool = False
    markers: tuple[str, ...] = MARKERS

    def extract(self, text: str) -> tuple[str | None, str]:
        """(reasoning_content, content) of a whole output: the stream's sum."""
        stream = self.new_stream()
        reasoning, content = stream.feed(text)
        more_reasoning, more_content = stream.finish()
        reasoning += more_reasoning
        return (reasoning if stream.entered_reasoning else None), content + more_content

    def new_stream(self) -> HarmonyStream:
        """Fresh streaming state for one request."""
        return HarmonyStream()

    def for_prompt(self, prompt: str) -> HarmonyReasoningParser:
        """This parser: a harmony prompt never opens a message's text for the output."""
        return self


@dataclass(slots=True)
class HarmonyStream:
    """Per-request incremental `HarmonyReasoningParser`.

    Contract: for any split of a text into deltas, the reasoning (content) parts of every
    `feed` result and of `finish()` add up to the same text; text that may be part of a marker
    and an unfinished header are held back until decided (a header the output ends in is
    dropped: it holds no text yet).
    """

    _state: str = _OUT
    _held: str = ""
    _route: str = _CONTENT
    _entered: bool = False
    _finished: bool = False
    _out: dict[str, list[str]] = field(default_factory=lambda: {_REASONING: [], _CONTENT: []})

    @property
    def entered_reasoning(self) -> bool:
        """Whether an analysis message was seen (``reasoning_content`` set)."""
        return self._entered

    def feed(self, delta: str) -> tuple[str, str]:
        """Add `delta`; return the (reasoning_delta, content_delta) now decided."""
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
        while self._step(final):
            pass
        reasoning, content = ("".join(self._out[k]) for k in (_REASONING, _CONTENT))
        self._out[_REASONING].clear()
        self._out[_CONTENT].clear()
        return reasoning, content

    def _step(self, final: bool) -> bool:
        """Consume what the held text decides; True if the state changed (step again)."""
        text = self._held
        if self._state == _HEAD:
            at = text.find(MESSAGE)
            if at < 0:
                if final:
                    self._held = ""  # an unfinished header: markup without text
                return False
            self._open_message(text[:at], text[at : at + len(MESSAGE)])
            self._held = text[at + len(MESSAGE) :]
            return True
        stops = _OPENS + _ENDS + ((MESSAGE,) if self._state == _OUT else ())
        found = _first(text, stops)
        if found is None:
            cut = len(text) if final else _safe_len(text, stops)
            self._text(text[:cut])
            self._held = text[cut:]
            return False
        at, marker = found
        self._text(text[:at])
        if marker in _OPENS:
            self._state, self._held = _HEAD, text[at:]
            return True
        if marker == MESSAGE:  # text with no header: content
            self._state, self._route = _BODY, _CONTENT
        else:
            if self._state == _BODY and self._route == _RAW:
                self._emit(_CONTENT, marker)
            self._state = _OUT
        self._held = text[at + len(marker) :]
        return True

    def _open_message(self, header: str, marker: str) -> None:
        channel, recipient = _header(header)
        self._state = _BODY
        if recipient is not None:
            self._route = _RAW
            self._emit(_CONTENT, header + marker)
        elif channel == "analysis":
            self._route, self._entered = _REASONING, True
        else:
            self._route = _CONTENT

    def _text(self, text: str) -> None:
        """Route message text (outside a message: content)."""
        route = self._route if self._state == _BODY else _CONTENT
        self._emit(_CONTENT if route == _RAW else route, text)

    def _emit(self, kind: str, text: str) -> None:
        if text:
            self._out[kind].append(text)


# ------------------------------------------------------------------ tool slot


@dataclass(slots=True)
class _CallCloser:
    """`Closer` of a call block (its body starts at the header): the message's text runs from
    ``<|message|>`` to an end marker (consumed) or to the next header (not consumed).
    Resumes its scan where a marker could still be completed."""

    _scan_from: int = 0

    def __call__(self, body: str) -> tuple[int, int] | None:
        start = body.find(MESSAGE)
        if start < 0:
            return None
        scan_from = max(start + len(MESSAGE), self._scan_from)
        found = _first(body, _ENDS + _OPENS, scan_from)
        if found is None:
            self._scan_from = max(scan_from, len(body) - len(CHANNEL) + 1)  # the longest
            return None
        at, marker = found
        return at, at + len(marker) if marker in _ENDS else at


@dataclass(slots=True, frozen=True)
class HarmonyFormat:
    """Harmony calls for `ToolCallParser`: a block is a whole message addressed to
    ``functions.NAME``, from its header's first marker; its body includes the header."""

    markers: tuple[str, ...] = MARKERS
    is_leading: bool = False

    def find_open(self, text: str) -> Span | int:
        at = 0
        while (found := _first(text, _OPENS, at)) is not None:
            start = found[0]
            message = text.find(MESSAGE, start)
            if message < 0:
                return start  # a header may be arriving
            start = max(start, text.rfind(START, start, message))  # the message's own header
            if _function(text[start:message]) is not None:
                return Span(start, start)
            at = message + len(MESSAGE)
        return _safe_len(text, _OPENS)

    def closer(self) -> _CallCloser:
        return _CallCloser()

    def parse(self, body: str) -> Calls | None:
        header, _, arguments = body.partition(MESSAGE)
        name = _function(header)
        if name is None:
            return None
        arguments = arguments.strip() or "{}"
        try:
            value = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
        if not isinstance(value, dict):
            return None
        return [(name, json.dumps(value, ensure_ascii=False))]


FORMAT = HarmonyFormat()
