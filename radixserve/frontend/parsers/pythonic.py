"""Pythonic tool calls (Llama 3.2 / Llama 4, some Gemma and ToolACE fine-tunes): the output is
a Python list of calls with keyword arguments, ``[get_weather(city="Paris"), now()]``.

Only an output that *starts* with the list (after whitespace) holds calls. The list is read
with `ast` and each argument with `ast.literal_eval`: literals only (strings, numbers,
True/False/None, lists, dicts, tuples), never evaluated code. A positional argument, ``**kw``,
a non-literal value, or anything JSON cannot hold (a set, bytes) makes the list content.
"""

from __future__ import annotations

import ast
import functools
import json

from radixserve.frontend.parsers.tool_format import Calls, JsonValueCloser, LeadingFormat

__all__ = ["FORMAT"]


def _call(node: ast.expr) -> tuple[str, str] | None:
    if (not isinstance(node, ast.Call) or node.args
            or not isinstance(node.func, ast.Name | ast.Attribute)):
        return None
    arguments = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            return None
        try:
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
    try:
        return ast.unparse(node.func), json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return None


def _parse(body: str) -> Calls | None:
    try:
        tree = ast.parse(body.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        return None
    calls = []
    for node in tree.body.elts:
        if (call := _call(node)) is None:
            return None
        calls.append(call)
    return calls


FORMAT = LeadingFormat("[", (), functools.partial(JsonValueCloser, quotes="\"'"), _parse)
