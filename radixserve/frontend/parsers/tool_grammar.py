"""``tool_choice: "auto"`` in the Hermes format, under a grammar: the answer is text, or text
and then calls, each call a well-formed call of one of the request's tools.

A small model left free writes calls that do not parse (cut JSON, an unknown name, arguments
of the wrong shape); the parser then keeps them as text, and an agent loop stalls. llama-server
constrains such answers with a grammar triggered by the call marker; this is ours, in Lark for
llguidance:

    start: TEXT | text calls
    TEXT: any text without "<tool_call>"                      (an answer without a call)
    text: any text, ended by "<tool_call>"                    (lazy: up to the first marker;
                                                              a suffix, not a stop: it rolls back)
    calls: the first call's body, then more calls (when parallel_tool_calls is not false)

Each call body is ``{"name": <one of the tools>, "arguments": <its parameters schema>}`` as
JSON, its schemas rewritten and closed as a strict ``response_format`` schema is
(structured/schema_rewrite.py, strict_schema.py). The Hermes parser
(frontend/parsers/hermes.py) reads the answer as it reads a free one.
"""

from __future__ import annotations

import json
from typing import Any

from radixserve.structured.schema_rewrite import enforceable_schema
from radixserve.structured.strict_schema import strict_schema

_CALL = '"\\n" body "\\n</tool_call>"'


def auto_tools_grammar(tools: list[tuple[str, dict[str, Any] | None]], parallel: bool) -> str:
    """The Lark grammar of an answer to ``tools`` ((name, parameters schema) pairs)."""
    calls = [{"type": "object", "properties": {
        "name": {"const": name},
        "arguments": enforceable_schema(schema) if schema else {"type": "object"}},
        "required": ["name", "arguments"]} for name, schema in tools]
    body = strict_schema(calls[0] if len(calls) == 1 else {"anyOf": calls})
    more = '\nmore: /[ \\t\\n]*/ "<tool_call>" ' + _CALL if parallel else ""
    return (
        "start: TEXT | text calls\n"
        "TEXT: /(?s:.+)/ & ~/(?s:.*<tool_call>.*)/\n"
        'text[suffix="<tool_call>"]: /(?s:.*)/\n'
        f"calls: {_CALL}{' more*' if parallel else ''}{more}\n"
        f"body: %json {json.dumps(body)}\n")
