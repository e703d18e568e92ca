"""GLM-4.5 / 4.6 / 4.7 tool calls (Z.ai): the function name, then key and value tags, in a
``<tool_call>`` block anywhere in the output::

    <tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>

GLM-4.5 and 4.6 put a newline after the name and after each tag pair; GLM-4.7 writes none.
A block is a call iff it is a name (no space, quote or bracket in it) and key/value pairs,
with only whitespace between them: ``<tool_call>name</tool_call>`` calls with ``{}``. The
template writes a string value as it is and any other value as JSON, so a value that parses as
JSON (``3``, ``true``, ``{"a": 1}``) is that value, anything else the string.
NOTE: as with Qwen3-Coder, the parser does not see the tools' schemas, so a string parameter
whose text is valid JSON (``42``, ``null``) arrives as that value, not as a string.
"""

from __future__ import annotations

import json
import re

from radixserve.frontend.parsers.tool_format import Calls, TaggedFormat, tiling_matches, until

__all__ = ["FORMAT"]

_NAME = re.compile(r"\s*([^\s<>\"'{}\[\]()]+)\s*")
_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>\s*", re.DOTALL)


def _value(raw: str) -> object:
    try:
        return json.loads(raw, parse_constant=_reject)  # NaN, Infinity: kept as text
    except (ValueError, RecursionError):
        return raw


def _reject(name: str) -> None:
    raise ValueError(name)


def _parse(body: str) -> Calls | None:
    name = _NAME.match(body)
    if name is None:
        return None
    pairs = tiling_matches(_PAIR, body[name.end() :])
    if pairs is None or any(not pair[1].strip() for pair in pairs):
        return None
    arguments = {pair[1].strip(): _value(pair[2]) for pair in pairs}
    return [(name[1], json.dumps(arguments, ensure_ascii=False))]


FORMAT = TaggedFormat("<tool_call>", until("</tool_call>"), _parse,
                      markers=("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
                               "<arg_value>", "</arg_value>"))
