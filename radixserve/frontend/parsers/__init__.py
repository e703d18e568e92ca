"""Output parsers for the chat endpoint: reasoning blocks and tool calls, whole or streamed.

Each parser is stateless (``extract(text)`` for a whole output) and hands out per-request
streaming state with ``new_stream()``; the streamed deltas always add up to ``extract``'s result.

Registries: `get_reasoning_parser` and `get_tool_parser` build a parser by its CLI name;
keyword arguments override the preset (e.g. ``starts_in_reasoning=True`` when the chat
template has opened the think block, or a deterministic ``id_factory``). Which tool-call format
a model writes is read from its chat template by `detect.detect_tool_format`, which reasoning
parser it needs by `detect.detect_reasoning_parser`; a request that
offers tools reads its answer through `lenient_json.LenientToolParser` around that format's
parser (calls a small model writes as bare or fenced JSON).
"""

from __future__ import annotations

import importlib
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
    "glm45": {},
    "deepseek_r1": {"starts_in_reasoning": True},
    "mistral": {"start_tag": "[THINK]", "end_tag": "[/THINK]"},
    "harmony": {},
    "gemma4": {"start_tag": "<|channel>thought", "end_tag": "<channel|>",
               "markers": ("<|channel>", "<channel|>")},
}
"""Reasoning parser name -> `ReasoningParser` preset. Qwen3 writes ``<think>`` itself (and its
template closes an empty block when thinking is off); DeepSeek-R1 templates open the block in the
prompt, so its output starts inside reasoning (a leading ``<think>`` is still accepted). Where a
template opens the block or not by a switch (Qwen3.5, Nemotron, GLM-4.7: ``enable_thinking``),
`ReasoningParser.for_prompt` reads which from the rendered prompt. Magistral and Ministral 3
write ``[THINK]...[/THINK]``; Gemma 4 ``<|channel>thought\n...<channel|>`` (its template
writes an empty block when thinking is off; ``<|think|>`` in the system turn switches it on:
``enable_thinking``). gpt-oss writes OpenAI's harmony channels (``harmony.py``: its own
parser, `HarmonyReasoningParser`)."""

TOOL_PARSERS: dict[str, str] = {
    "hermes": "hermes",
    "qwen2_5": "hermes",
    "qwen3": "hermes",
    "qwen3_coder": "qwen3_coder",
    "llama3_json": "llama3_json",
    "mistral": "mistral",
    "pythonic": "pythonic",
    "phi4_mini": "phi4_mini",
    "deepseek_v3": "deepseek_v3",
    "glm45": "glm_xml",
    "glm47": "glm_xml",
    "lfm2": "lfm2",
    "nemotron_v2": "nemotron_v2",
    "harmony": "harmony",
    "gemma4": "gemma4",
}
"""Tool parser name -> the module of its format in this package (imported when built): its
``FORMAT`` (a `ToolFormat`) and, where the format's templates demand their own call ids, its
``ID_FACTORY``. Qwen2.5 and Qwen3 write the Hermes format; Qwen3.5 and Nemotron 3 Nano the
Qwen3-Coder one; GLM-4.5 to 4.7 one format (``glm45``, ``glm47`` as vLLM names them); Gemma 4
its own (``gemma4``: ``<|tool_call>call:NAME{key:value}<tool_call|>``)."""


def get_reasoning_parser(name: str, **overrides: Any) -> ReasoningParser:
    """Build the reasoning parser called `name`; ValueError (listing the names) if unknown."""
    if name == "harmony":
        from radixserve.frontend.parsers.harmony import HarmonyReasoningParser

        return _build("reasoning", REASONING_PARSERS, HarmonyReasoningParser, name, overrides)
    return _build("reasoning", REASONING_PARSERS, ReasoningParser, name, overrides)


def get_tool_parser(name: str, **overrides: Any) -> ToolCallParser:
    """Build the tool-call parser called `name`; ValueError (listing the names) if unknown."""
    module_name = TOOL_PARSERS.get(name)
    if module_name is None:
        raise ValueError(f"unknown tool parser {name!r}; supported: {', '.join(TOOL_PARSERS)}")
    module = importlib.import_module(f"{__name__}.{module_name}")
    preset = {"format": module.FORMAT, "id_factory": getattr(module, "ID_FACTORY", make_call_id)}
    return ToolCallParser(**{**preset, **overrides})


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
