"""Which tool-call format a model writes, read from its chat template.

A template that renders tool calls spells out the format its model was trained on: the markers
it writes an assistant's earlier calls with, or the instruction it gives with the tools. The
first rule that matches names the parser (`TOOL_PARSERS`):

================================================  ============
the template contains                             format
================================================  ============
``tool▁calls▁begin``                              deepseek_v3
``[TOOL_CALLS]``                                  mistral
``functools[`` or ``<|/tool|>``                   phi4_mini
``<|tool_call_start|>``, ``<|tool_list_start|>``  lfm2
or ``List of tools: [`` (LFM2.5)
``<TOOLCALL>`` (Nemotron Nano v2)                 nemotron_v2
``<tool_call>`` and ``<arg_key>`` (GLM-4.x)       glm45
``<tool_call>`` and ``<function=``                qwen3_coder
``<tool_call>``                                   hermes
``[func_name1(`` (pythonic instruction)           pythonic
``<|python_tag|>`` or ``"parameters": dict``      llama3_json
================================================  ============

Qwen3.5 and Nemotron 3 Nano write Qwen3-Coder's format, Granite 4 and SmolLM3 Hermes',
Ministral 3 Mistral's. LFM2.5-Instruct's template names no marker at all (only its "List of
tools: [" line), and LFM2's none of the call's: their models write the call markers anyway.

A template that does not read ``tools`` at all gets the tools, and reads the calls back, in the
generic format of ``tokenizer/tool_prompt.py``: hermes. So does a template that reads them but
names none of the markers above, and a model without a template.

The reasoning parser a template's model needs (`detect_reasoning_parser`) is read the same way:
``[THINK]`` (Magistral, Ministral 3): mistral; ``<think>`` or ``</think>`` (Qwen3 and 3.5,
Nemotron, SmolLM3, GLM-4.x, LFM2.5, DeepSeek-R1): think, whether an output starts inside the
block being read from its rendered prompt (`ReasoningParser.for_prompt`); else none.
"""

from __future__ import annotations

import re

from radixserve.tokenizer.tool_prompt import reads_tools

__all__ = ["AUTO", "detect_reasoning_parser", "detect_tool_format", "resolve_tool_format"]

AUTO = "auto"
"""The ``--tool-call-parser`` value that asks for detection."""

_RULES: list[tuple[str, re.Pattern[str]]] = [
    ("deepseek_v3", re.compile(r"tool▁calls▁begin")),
    ("mistral", re.compile(r"\[TOOL_CALLS\]")),
    ("phi4_mini", re.compile(r"functools\[|<\|/tool\|>")),
    ("lfm2", re.compile(r"<\|tool_call_start\|>|<\|tool_list_start\|>|List of tools: \[")),
    ("nemotron_v2", re.compile(r"<TOOLCALL>")),
    ("glm45", re.compile(r"<tool_call>[\s\S]*<arg_key>|<arg_key>[\s\S]*<tool_call>")),
    ("qwen3_coder", re.compile(r"<tool_call>[\s\S]*<function=|<function=[\s\S]*<tool_call>")),
    ("hermes", re.compile(r"<tool_call>")),
    ("pythonic", re.compile(r"\[func_name\d*\(")),
    ("llama3_json", re.compile(r"<\|python_tag\|>|\"parameters\"\s*:\s*dictionary")),
]


def detect_tool_format(chat_template: str | None) -> str:
    """The tool parser name for a chat template's source (None: the model has none)."""
    return _detect(chat_template)[0]


def detect_reasoning_parser(chat_template: str | None) -> str | None:
    """The reasoning parser name (`REASONING_PARSERS`) for a chat template's source, or None
    when the template shows no reasoning block (the module docstring's rules)."""
    if not chat_template:
        return None
    if "[THINK]" in chat_template:
        return "mistral"
    if "<think>" in chat_template or "</think>" in chat_template:
        return "think"
    return None


def resolve_tool_format(requested: str, chat_template: str | None) -> tuple[str, str]:
    """(parser name, why) for ``--tool-call-parser`` `requested`: the name itself unless it is
    ``"auto"``, else what the template shows (`detect_tool_format`). ``why`` is a few words for
    the log: "from the chat template", "set by --tool-call-parser", ..."""
    if requested != AUTO:
        return requested, "set by --tool-call-parser"
    return _detect(chat_template)


def _detect(chat_template: str | None) -> tuple[str, str]:
    if not chat_template:
        return "hermes", "the generic format: the model has no chat template"
    if not reads_tools(chat_template):
        return "hermes", "the generic format: the chat template does not render tools"
    for name, pattern in _RULES:
        if pattern.search(chat_template):
            return name, "from the chat template"
    return "hermes", "the default: the chat template names no known format"
