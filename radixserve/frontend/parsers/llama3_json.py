"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: the output is the call,
``{"name": "get_weather", "parameters": {"city": "Paris"}}``, optionally after
``<|python_tag|>`` (3.1 writes it; it is a special token, so it is often decoded away), and
several calls follow one another separated by ``;`` or whitespace (3.2).

Only an output that *starts* with such an object (after whitespace and the tag) holds calls;
the arguments key is ``"parameters"`` as the templates ask, ``"arguments"`` is accepted too.
An object of another shape, or anything else where the next call could start, makes the rest
of the output content.
"""

from __future__ import annotations

import functools

from radixserve.frontend.parsers.tool_format import JsonValueCloser, LeadingFormat, object_call

__all__ = ["FORMAT"]

FORMAT = LeadingFormat(
    "{",
    (";", "<|python_tag|>"),
    JsonValueCloser,
    functools.partial(object_call, keys=("parameters", "arguments")),
    markers=("<|python_tag|>",),
)
