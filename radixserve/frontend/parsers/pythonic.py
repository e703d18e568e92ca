"""Pythonic tool calls (Llama 3.2 / Llama 4, some Gemma and ToolACE fine-tunes): the output is
a Python list of calls with keyword arguments, ``[get_weather(city="Paris"), now()]``.

Only an output that *starts* with the list (after whitespace) holds calls. The list is read
with `ast` and each argument with `ast.literal_eval`: literals only (strings, numbers,
True/False/None, lists, dicts, tuples), never evaluated code. A positional argument, ``**kw``,
a non-literal value, or anything JSON cannot hold (a set, bytes) makes the list content.
`parse_call_list` is shared with LFM2's marked lists (``lfm2.py``), which also take JSON's
``true``/``false``/``null``.
"""

from __future__ import annotations

import ast
import functools
import json

from radixserve.frontend.parsers.tool_format import Calls, JsonValueCloser, LeadingFormat

__all__ = ["FORMAT", "parse_call_list"]

_JSON_LITERALS = {"true": True, "false": False, "null": None}


class _JsonNames(ast.NodeTransformer):
    """Reads the bare names ``true``, ``false`` and ``null`` as the JSON literals."""

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if node.id in _JSON_LITERALS:
            return ast.copy_location(ast.Constant(_JSON_LITERALS[node.id]), node)
        return node


def _call(node: ast.expr, json_literals: bool) -> tuple[str, str] | None:
    if (not isinstance(node, ast.Call) or node.args
            or not isinstance(node.func, ast.Name | ast.Attribute)):
        return None
    arguments = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            return None
        value = _JsonNames().visit(keyword.value) if json_literals else keyword.value
        try:
            arguments[keyword.arg] = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
    try:
        return ast.unparse(node.func), json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return None


def parse_call_list(body: str, json_literals: bool = False) -> Calls | None:
    """The calls of `body`, a non-empty Python list of calls (whitespace around it), or None.
    ``json_literals``: ``true``, ``false`` and ``null`` are values too."""
    try:
        tree = ast.parse(body.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        return None
    calls = []
    for node in tree.body.elts:
        if (call := _call(node, json_literals)) is None:
            return None
        calls.append(call)
    return calls


FORMAT = LeadingFormat("[", (), functools.partial(JsonValueCloser, quotes="\"'"),
                       parse_call_list)
