"""DeepSeek V3 / R1-0528 and V3.1 tool calls, in one block anywhere in the output::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

V3.1 writes each call as ``<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}
<｜tool▁call▁end｜>`` instead; both are read. The block (to ``<｜tool▁calls▁end｜>``, or the end
of the output) must hold one or more calls and only whitespace between them; its calls go
out together when it closes.
"""

from __future__ import annotations

import re

from radixserve.frontend.parsers.tool_format import (
    Calls,
    TaggedFormat,
    json_call,
    load_json,
    tiling_matches,
    until,
)

__all__ = ["FORMAT"]

_BEGIN, _END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_CALL_BEGIN, _SEP, _CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
_CALL = re.compile(
    rf"\s*{re.escape(_CALL_BEGIN)}(.*?){re.escape(_SEP)}(.*?){re.escape(_CALL_END)}\s*", re.S)
_V3_BODY = re.compile(r"([^\n]+)\n```(?:json)?\n(.*)\n```\s*", re.S)


def _call(head: str, body: str) -> tuple[str, str] | None:
    v3 = _V3_BODY.fullmatch(body) if head.strip() == "function" else None
    name, arguments = (v3[1], v3[2]) if v3 else (head, body)
    return json_call({"name": name.strip(), "arguments": load_json(arguments)})


def _parse(body: str) -> Calls | None:
    calls = []
    for found in tiling_matches(_CALL, body) or ():
        if (call := _call(found[1], found[2])) is None:
            return None
        calls.append(call)
    return calls or None


FORMAT = TaggedFormat(_BEGIN, until(_END), _parse,
                      markers=(_BEGIN, _END, _CALL_BEGIN, _SEP, _CALL_END))
