"""Mistral tool calls, after the ``[TOOL_CALLS]`` marker (a control token: the server decodes
it only where the tokenizer keeps it), anywhere in the output:

* v0.3 templates (Mistral 7B v0.3, Nemo, Small 3.1):
  ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``, one JSON array of calls;
* newer templates (tokenizer v11+: Small 3.2, Magistral, Devstral):
  ``[TOOL_CALLS]name[ARGS]{...}``, repeated for several calls; an optional
  ``[CALL_ID]id`` before ``[ARGS]`` is ignored, and ``[ARGS]`` may be missing (decoded away).

Mistral's templates accept only 9-character alphanumeric call ids, so this format's parser
makes such ids (`mistral_call_id`).
"""

from __future__ import annotations

import re
import secrets
import string
from dataclasses import dataclass

from radixserve.frontend.parsers.tool_format import (
    BracketScanner,
    Calls,
    TaggedFormat,
    array_calls,
    json_call,
    load_json,
)

__all__ = ["FORMAT", "ID_FACTORY", "mistral_call_id"]

_NAMED = re.compile(r"([\w.\-]+)(?:\[CALL_ID\][A-Za-z0-9]+)?(?:\[ARGS\])?\s*(\{.*\})", re.S)
_ID_CHARS = string.ascii_letters + string.digits


def mistral_call_id() -> str:
    """A call id Mistral's templates accept: 9 random letters and digits."""
    return "".join(secrets.choice(_ID_CHARS) for _ in range(9))


@dataclass(slots=True)
class _Closer:
    """The block ends with its JSON: the array (v0.3), else the first object (the arguments)."""

    _scanner: BracketScanner | None = None
    _scan_from: int = 0

    def __call__(self, body: str) -> tuple[int, int] | None:
        if self._scanner is None:
            first = len(body) - len(body.lstrip())
            if first == len(body):
                return None
            start = first if body[first] == "[" else body.find("{", max(first, self._scan_from))
            if start < 0:
                self._scan_from = len(body)
                return None
            self._scanner = BracketScanner(start)
        end = self._scanner(body)
        return None if end is None else (end, end)


def _parse(body: str) -> Calls | None:
    body = body.strip()
    if body.startswith("["):
        return array_calls(body)
    named = _NAMED.fullmatch(body)
    if named is None:
        return None
    call = json_call({"name": named[1], "arguments": load_json(named[2])})
    return None if call is None else [call]


FORMAT = TaggedFormat("[TOOL_CALLS]", _Closer, _parse,
                      markers=("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"))
ID_FACTORY = mistral_call_id
