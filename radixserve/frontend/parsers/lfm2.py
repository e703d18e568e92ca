"""LFM2 / LFM2.5 tool calls (Liquid AI): a pythonic call list between marker tokens, anywhere
in the output, after text or reasoning::

    Let me check.<|tool_call_start|>[get_weather(city="Paris", days=3)]<|tool_call_end|>

The list is read as `pythonic.parse_call_list` reads it (literals only, never evaluated), with
JSON's ``true``/``false``/``null`` accepted beside Python's, as llama.cpp accepts them; dotted
names (``Calendar.create_event``) are names. A block whose list does not parse is content.
"""

from __future__ import annotations

import functools

from radixserve.frontend.parsers.pythonic import parse_call_list
from radixserve.frontend.parsers.tool_format import TaggedFormat, until

__all__ = ["FORMAT"]

START, END = "<|tool_call_start|>", "<|tool_call_end|>"

FORMAT = TaggedFormat(START, until(END), functools.partial(parse_call_list, json_literals=True),
                      markers=(START, END))
