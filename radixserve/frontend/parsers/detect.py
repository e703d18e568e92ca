"""Which tool-call format a model writes, read from its chat template.

A template that renders tool calls spells out the format its model was trained on: the markers
it writes an assistant's earlier calls with, or the instruction it gives with the tools. The
first rule that matches names the parser (`TOOL_PARSERS`):

==========================================  ============
the template contains                        format
==========================================  ============
``tool▁calls▁begin``                         deepseek_v3
``[TOOL_CALLS]``                             mistral
``functools[`` or ``<|/tool|>``              phi4_mini
``<tool_call>`` and ``<function=``           qwen3_coder
``<tool_call>``                              hermes
``[func_name1(`` (pythonic instruction)      pythonic
``<|python_tag|>`` or ``"parameters": dict``  llama3_json
==========================================  ============

A template that does not read ``tools`` at all gets the tools, and reads the calls back, in the
generic format of ``tokenizer/tool_prompt.py``: hermes. So does a template that reads them but
names none of the markers above, and a model without a template.
"""

from __future__ import annotations

import re

from radixserve.tokenizer.tool_prompt import reads_tools

__all__ = ["AUTO", "detect_tool_format", "resolve_tool_format"]

AUTO = "auto"
"""The ``--tool-call-parser`` value that asks for detection."""

_RULES: list[tuple[str, re.Pattern[str]]] = [
    ("deepseek_v3", re.compile(r"tool▁calls▁begin")),
    ("mistral", re.compile(r"\[TOOL_CALLS\]")),
    ("phi4_mini", re.compile(r"functools\[|<\|/tool\|>")),
    ("qwen3_coder", re.compile(r"<tool_call>[\s\S]*<function=|<function=[\s\S]*<tool_call>")),
    ("hermes", re.compile(r"<tool_call>")),
    ("pythonic", re.compile(r"\[func_name\d*\(")),
    ("llama3_json", re.compile(r"<\|python_tag\|>|\"parameters\"\s*:\s*dictionary")),
]


def detect_tool_format(chat_template: str | None) -> str:
    """The tool parser name for a chat template's source (None: the model has none)."""
    return _detect(chat_template)[0]


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
