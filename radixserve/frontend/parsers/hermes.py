"""Hermes tool calls (Hermes 2 Pro, Qwen2.5, Qwen3; also the generic format that
``tokenizer/tool_prompt.py`` teaches models whose templates cannot render tools):
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one block per call,
anywhere in the output.

A block runs from ``<tool_call>`` to the first ``</tool_call>`` after it (or the end of the
output); it is a call iff its body is a JSON object with a non-empty string ``"name"`` and an
``"arguments"`` object (absent means ``{}``).
"""

from __future__ import annotations

from radixserve.frontend.parsers.tool_format import TaggedFormat, object_call, until

__all__ = ["FORMAT"]

FORMAT = TaggedFormat("<tool_call>", until("</tool_call>"), object_call,
                      markers=("<tool_call>", "</tool_call>"))
