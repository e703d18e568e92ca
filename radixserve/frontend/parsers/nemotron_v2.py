"""NVIDIA Nemotron Nano v2 tool calls: a JSON array of call objects between ``<TOOLCALL>``
tags, anywhere in the output (its template's instruction and history write them so)::

    <TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL>

Every element must be ``{"name": str, "arguments": object}`` (absent arguments: ``{}``); the
instruction shows the arguments as a string, so a string holding a JSON object is read as that
object. Anything else keeps the block as content.
"""

from __future__ import annotations

from radixserve.frontend.parsers.tool_format import (
    Calls,
    TaggedFormat,
    json_call,
    load_json,
    until,
)

__all__ = ["FORMAT"]


def _parse(body: str) -> Calls | None:
    value = load_json(body)
    if not isinstance(value, list) or not value:
        return None
    calls = []
    for item in value:
        if isinstance(item, dict) and isinstance(item.get("arguments"), str):
            item = {**item, "arguments": load_json(item["arguments"])}
        if (call := json_call(item)) is None:
            return None
        calls.append(call)
    return calls


FORMAT = TaggedFormat("<TOOLCALL>", until("</TOOLCALL>"), _parse,
                      markers=("<TOOLCALL>", "</TOOLCALL>"))
