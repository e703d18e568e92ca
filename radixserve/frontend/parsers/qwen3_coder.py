"""Qwen3-Coder tool calls: XML-like blocks, anywhere in the output::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

A block holds one or more functions and nothing else but whitespace; a function holds
parameters and whitespace. A value loses one newline on each side; it becomes the JSON value it
spells when it parses as JSON (``3``, ``true``, ``{"a": 1}``), else the string itself.
NOTE: the parser does not see the tools' schemas, so a string parameter whose text is valid
JSON (``42``, ``null``) arrives as that value, not as a string.
"""

from __future__ import annotations

import json
import re

from radixserve.frontend.parsers.tool_format import Calls, TaggedFormat, tiling_matches, until

__all__ = ["FORMAT"]

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", re.S)
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>(.*?)</parameter>\s*", re.S)


def _value(raw: str) -> object:
    raw = raw.removeprefix("\n").removesuffix("\n")
    try:
        return json.loads(raw, parse_constant=_reject)  # NaN, Infinity: kept as text
    except (ValueError, RecursionError):
        return raw


def _reject(name: str) -> None:
    raise ValueError(name)


def _parse(body: str) -> Calls | None:
    functions = tiling_matches(_FUNCTION, body)
    if not functions:
        return None
    calls = []
    for function in functions:
        name, inner = function[1].strip(), function[2]
        parameters = tiling_matches(_PARAMETER, inner) if inner.strip() else []
        if parameters is None or not name:
            return None
        arguments = {p[1].strip(): _value(p[2]) for p in parameters}
        calls.append((name, json.dumps(arguments, ensure_ascii=False)))
    return calls


FORMAT = TaggedFormat("<tool_call>", until("</tool_call>"), _parse,
                      markers=("<tool_call>", "</tool_call>"))
