"""Gemma 4 tool calls (Google): a call per ``<|tool_call>`` block anywhere in the output, its
arguments in the template's own object syntax (the ``format_argument`` macro), not JSON::

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>

Values: strings between ``<|"|>`` markers (no escapes: the text runs to the next marker),
numbers as JSON writes them, ``true`` / ``false`` / ``null``, objects ``{key:value,...}`` and
arrays ``[value,...]``. Keys are bare (``[^:}]`` as llama.cpp reads them, trimmed), or quoted
with ``<|"|>`` as the macro writes them outside calls. Whitespace is allowed between tokens.
A block is a call iff its body is ``call:NAME`` and one such object, whitespace around;
anything else (a bare word as a value, a missing ``}``) keeps the block as text.
NOTE: the grammar is the one llama.cpp parses (common/parsers/gemma4.cpp), a little laxer
on whitespace and quoted keys.
"""

from __future__ import annotations

import json
import re

from radixserve.frontend.parsers.tool_format import Calls, TaggedFormat, until

__all__ = ["FORMAT", "parse_value"]

QUOTE = '<|"|>'
_HEAD = re.compile(r"\s*call:([^\s{}\[\]<>\"',:]+)(?=\{)")
_SPACE = re.compile(r"\s*")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_BARE_KEY = re.compile(r"[^:}]+")
_LITERALS = {"true": True, "false": False, "null": None}


class _Malformed(ValueError):
    """The text is not in the call syntax."""


def _skip(text: str, at: int) -> int:
    return _SPACE.match(text, at).end()  # type: ignore[union-attr]  # \s* always matches


def _string(text: str, at: int) -> tuple[str, int]:
    """The string whose opening marker is at `at`, and the index past its closing one."""
    end = text.find(QUOTE, at + len(QUOTE))
    if end < 0:
        raise _Malformed("unterminated string")
    return text[at + len(QUOTE) : end], end + len(QUOTE)


def _key(text: str, at: int) -> tuple[str, int]:
    """An object key at `at` (quoted or bare) and the index past its ``:``."""
    if text.startswith(QUOTE, at):
        key, at = _string(text, at)
        at = _skip(text, at)
    else:
        found = _BARE_KEY.match(text, at)
        if found is None:
            raise _Malformed("missing key")
        key, at = found[0].strip(), found.end()
    if not key or not text.startswith(":", at):
        raise _Malformed("missing key or ':'")
    return key, at + 1


def _items(text: str, at: int, close: str, is_object: bool) -> tuple[object, int]:
    """The object or array whose opening bracket was just before `at`."""
    out: dict[str, object] | list[object] = {} if is_object else []
    at = _skip(text, at)
    if text.startswith(close, at):
        return out, at + 1
    while True:
        if is_object:
            key, at = _key(text, at)
            value, at = _value(text, _skip(text, at))
            out[key] = value  # type: ignore[index]
        else:
            value, at = _value(text, at)
            out.append(value)  # type: ignore[union-attr]
        at = _skip(text, at)
        if text.startswith(close, at):
            return out, at + 1
        if not text.startswith(",", at):
            raise _Malformed(f"expected ',' or {close!r}")
        at = _skip(text, at + 1)


def _value(text: str, at: int) -> tuple[object, int]:
    """The value starting at `at` and the index past it."""
    if text.startswith(QUOTE, at):
        return _string(text, at)
    if text.startswith("{", at):
        return _items(text, at + 1, "}", is_object=True)
    if text.startswith("[", at):
        return _items(text, at + 1, "]", is_object=False)
    for word, value in _LITERALS.items():
        if text.startswith(word, at):
            return value, at + len(word)
    number = _NUMBER.match(text, at)
    if number is None:
        raise _Malformed(f"no value at {at}")
    return json.loads(number[0]), number.end()


def parse_value(text: str) -> object:
    """The one value that `text` is (whitespace around it); ValueError if it is not one."""
    try:
        value, at = _value(text, _skip(text, 0))
    except RecursionError as error:
        raise _Malformed("nested too deep") from error
    if _skip(text, at) != len(text):
        raise _Malformed("text after the value")
    return value


def _parse(body: str) -> Calls | None:
    head = _HEAD.match(body)
    if head is None:
        return None
    try:
        arguments = parse_value(body[head.end() :])
        if not isinstance(arguments, dict):
            return None
        # NOTE: allow_nan=False: a number too large for a float (1e999) is no JSON value
        return [(head[1], json.dumps(arguments, ensure_ascii=False, allow_nan=False))]
    except ValueError:
        return None


FORMAT = TaggedFormat("<|tool_call>", until("<tool_call|>"), _parse,
                      markers=("<|tool_call>", "<tool_call|>", QUOTE))
