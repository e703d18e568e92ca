"""Which tool-call format a chat template shows, read from its source.

A template that renders tool calls spells out the format its model was trained on: the markers
it writes an assistant's earlier calls with, or the instruction it gives with the tools. The
first rule that matches names the format (a ``--tool-call-parser`` name):

================================================  ============
the template contains                             format
================================================  ============
``<|channel|>`` (harmony: gpt-oss)                harmony
``<|tool_call>`` (Gemma 4)                        gemma4
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
generic format of `tool_prompt`: hermes. So does a template that reads them but names none of
the markers above, and a model without a template.

Both the server (`frontend/parsers/detect.py`: which parser reads the output) and `tool_prompt`
(which format an earlier call is written in, for a template that cannot write it) use these
rules, so the two always agree.
"""

from __future__ import annotations

import functools
import re

__all__ = ["reads_tools", "template_tool_format"]

_TOOLS = re.compile(r"\btools\b")

_RULES: list[tuple[str, re.Pattern[str]]] = [
    ("harmony", re.compile(r"<\|channel\|>")),
    ("gemma4", re.compile(r"<\|tool_call>")),
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


def reads_tools(source: str) -> bool:
    """Whether the template renders the ``tools`` it is given."""
    return bool(_TOOLS.search(source))


@functools.lru_cache(maxsize=16)  # a server renders with one template; rules scan all of it
def template_tool_format(source: str | None) -> tuple[str, str]:
    """(format name, why) for a chat template's source (None: the model has none), by the
    module's rules. ``why`` is a few words for a log line."""
    if not source:
        return "hermes", "the generic format: the model has no chat template"
    if not reads_tools(source):
        return "hermes", "the generic format: the chat template does not render tools"
    for name, pattern in _RULES:
        if pattern.search(source):
            return name, "from the chat template"
    return "hermes", "the default: the chat template names no known format"
