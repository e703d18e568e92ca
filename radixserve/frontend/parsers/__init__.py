"""Output parsers for the chat endpoint: reasoning blocks and tool calls, whole or streamed.

Each parser is stateless (``extract(text)`` for a whole output) and hands out per-request
streaming state with ``new_stream()``; the streamed deltas always add up to ``extract``'s result.

Registries: `get_reasoning_parser` and `get_tool_parser` build a parser by its CLI name;
keyword arguments override the preset (e.g. ``starts_in_reasoning=True`` when the chat
template has opened the think block, or a deterministic ``id_factory``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixserve.frontend.parsers.forced_tools import ForcedToolParser, required_tools_schema
from radixserve.frontend.parsers.reasoning import ReasoningParser, ReasoningStream
from radixserve.frontend.parsers.tool_calls import (
    StreamDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallParser,
    ToolCallStream,
    make_call_id,
)

__all__ = [
    "ForcedToolParser",
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "ReasoningParser",
    "ReasoningStream",
    "StreamDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "ToolCallStream",
    "get_reasoning_parser",
    "get_tool_parser",
    "make_call_id",
    "required_tools_schema",
]

REASONING_PARSERS: dict[str, dict[str, Any]] = {
    "think": {},
    "qwen3": {},
    "deepseek_r1": {"starts_in_reasoning": True},
}
"""Reasoning parser name -> `ReasoningParser` preset. Qwen3 writes ``<think>`` itself (and its
template closes an empty block when thinking is off); DeepSeek-R1 templates open the block in the
prompt, so its output starts inside reasoning (a leading ``<think>`` is still accepted)."""

TOOL_PARSERS: dict[str, dict[str, Any]] = {
    "hermes": {},
    "qwen2_5": {},
    "qwen3": {},
}
"""Tool parser name -> `ToolCallParser` preset; all use the Hermes ``<tool_call>`` format."""


def get_reasoning_parser(name: str, **overrides: Any) -> ReasoningParser:
    """Build the reasoning parser called `name`; ValueError (listing the names) if unknown."""
    return _build("reasoning", REASONING_PARSERS, ReasoningParser, name, overrides)


def get_tool_parser(name: str, **overrides: Any) -> ToolCallParser:
    """Build the tool-call parser called `name`; ValueError (listing the names) if unknown."""
    return _build("tool", TOOL_PARSERS, ToolCallParser, name, overrides)


def _build(
    kind: str,
    registry: dict[str, dict[str, Any]],
    factory: Callable[..., Any],
    name: str,
    overrides: dict[str, Any],
) -> Any:
    preset = registry.get(name)
    if preset is None:
        supported = ", ".join(sorted(registry))
        raise ValueError(f"unknown {kind} parser {name!r}; supported: {supported}")
    return factory(**{**preset, **overrides})
