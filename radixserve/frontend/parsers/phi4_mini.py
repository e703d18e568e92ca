"""Phi-4-mini tool calls: ``functools[{"name": ..., "arguments": {...}}, ...]``, a JSON array
of calls after the word ``functools``, anywhere in the output.

``functools`` not followed (after whitespace) by a JSON array or object holds no call: the word
stays in the content, as does an array that is not all calls.
"""

from __future__ import annotations

from radixserve.frontend.parsers.tool_format import JsonValueCloser, TaggedFormat, array_calls

__all__ = ["FORMAT"]

FORMAT = TaggedFormat("functools", JsonValueCloser, array_calls)
