"""The chat parsers of one sample's text, as the chat, Responses and Anthropic endpoints share
them (`ChoiceStream`)."""

from __future__ import annotations

from radixserve.frontend.openai.protocol_chat import (DeltaFunctionCall, DeltaMessage,
                                                      DeltaToolCall)
from radixserve.frontend.parsers import ToolCallDelta


class ChoiceStream:
    """One sample's streaming parsers: reasoning first, then tool calls on the content.

    ``feed`` each new piece of the sample's text, then ``finish`` once at its end; each returns
    the chat deltas that text completes (reasoning, content, tool-call pieces), in order. The
    chat, Responses and Anthropic endpoints all build their output from these deltas."""

    def __init__(self, reasoning_parser, tool_parser) -> None:
        self.reasoning = reasoning_parser.new_stream() if reasoning_parser else None
        self.tools = tool_parser.new_stream() if tool_parser else None

    @property
    def has_tool_calls(self) -> bool:
        return self.tools is not None and self.tools.has_tool_calls

    def feed(self, text: str) -> list[DeltaMessage]:
        if not text:
            return []
        if self.reasoning is None:
            return self._content(text, final=False)
        reasoning, content = self.reasoning.feed(text)
        return self._merge(reasoning, content, final=False)

    def finish(self) -> list[DeltaMessage]:
        if self.reasoning is None:
            return self._content("", final=True)
        reasoning, content = self.reasoning.finish()
        return self._merge(reasoning, content, final=True)

    def _merge(self, reasoning: str, content: str, final: bool) -> list[DeltaMessage]:
        out = [DeltaMessage(reasoning_content=reasoning)] if reasoning else []
        return out + self._content(content, final)

    def _content(self, text: str, final: bool) -> list[DeltaMessage]:
        if self.tools is None:
            return [DeltaMessage(content=text)] if text else []
        items = self.tools.feed(text) if text else []
        if final:
            items += self.tools.finish()
        return [DeltaMessage(tool_calls=[DeltaToolCall(
                    index=item.index, id=item.id, type="function" if item.id else None,
                    function=DeltaFunctionCall(name=item.name, arguments=item.arguments_delta))])
                if isinstance(item, ToolCallDelta) else DeltaMessage(content=item)
                for item in items]
