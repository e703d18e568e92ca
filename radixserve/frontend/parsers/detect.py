"""Which parsers a model's output needs, read from its chat template.

The tool-call format is the one the template shows (`detect_tool_format`; the rules, shared
with the history writer of ``tokenizer/tool_prompt.py``, are in ``tokenizer/template_formats.py``).

The reasoning parser a template's model needs (`detect_reasoning_parser`) is read the same way:
``<|channel|>`` (gpt-oss): harmony; ``<|channel>`` (Gemma 4): gemma4; ``[THINK]`` (Magistral,
Ministral 3): mistral; ``<think>`` or ``</think>`` (Qwen3 and 3.5, Nemotron, SmolLM3, GLM-4.x,
LFM2.5, DeepSeek-R1): think, whether an output starts inside the block being read from each
request's rendered prompt (`ReasoningParser.for_prompt`); else none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixserve.frontend.parsers import get_reasoning_parser
from radixserve.frontend.parsers.reasoning import ReasoningParser
from radixserve.tokenizer.template_formats import template_tool_format

if TYPE_CHECKING:
    from radixserve.tokenizer.tokenizer import Tokenizer

__all__ = ["AUTO", "detect_reasoning_parser", "detect_tool_format", "reasoning_parser_for",
           "resolve_tool_format"]

AUTO = "auto"
"""The ``--tool-call-parser`` and ``--reasoning-parser`` value that asks for detection."""


def detect_tool_format(chat_template: str | None) -> str:
    """The tool parser name for a chat template's source (None: the model has none)."""
    return template_tool_format(chat_template)[0]


def detect_reasoning_parser(chat_template: str | None) -> str | None:
    """The reasoning parser name (`REASONING_PARSERS`) for a chat template's source, or None
    when the template shows no reasoning block (the module docstring's rules)."""
    if not chat_template:
        return None
    if "<|channel|>" in chat_template:
        return "harmony"
    if "<|channel>" in chat_template:
        return "gemma4"
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
    return template_tool_format(chat_template)


def reasoning_parser_for(requested: str | None, tokenizer: Tokenizer
                         ) -> tuple[str | None, ReasoningParser | None, str]:
    """(name, parser, why) for ``--reasoning-parser`` `requested`: None for none, ``"auto"``
    for the one the tokenizer's chat template shows (`detect_reasoning_parser`; none when it
    shows no block), else that name (ValueError listing the names if unknown). Name and parser
    are None for none; ``why`` is a few words for the log.

    Mutates the tokenizer: the parser's tags (or its ``markers``, the special tokens its tags
    are spelled with: Gemma 4's ``<|channel>``) that are special tokens (Mistral's ``[THINK]``)
    decode as text from now on, so that the parser sees them (``why`` then names them).
    """
    if requested is None:
        return None, None, "no --reasoning-parser"
    name, why = requested, "set by --reasoning-parser"
    if requested == AUTO:
        name = detect_reasoning_parser(tokenizer.chat_template)
        if name is None:
            return None, None, "the chat template shows no reasoning block"
        why = "from the chat template"
    parser = get_reasoning_parser(name)
    # harmony's and Gemma 4's tags are not single tokens: their parsers name the markers
    kept = tokenizer.decode_as_text(parser.markers or (parser.start_tag, parser.end_tag))
    if kept:
        why += f"; special tokens decoded as text: {' '.join(kept)}"
    return name, parser, why
