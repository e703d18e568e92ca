"""Tool calls forced by ``tool_choice``: the output was constrained to the call itself.

* A named function: the whole output is that function's arguments object (constrained to its
  parameters schema); it streams as one call whose arguments arrive fragment by fragment.
* ``"required"``: the output is a JSON array of ``{"name", "arguments"}`` objects, each
  constrained to one of the tools; the calls go out when the array is complete.

The same interface as `ToolCallParser`, so the chat endpoint treats both alike. Output that does
not parse (cut by max_tokens) is returned as content, without calls.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from radixserve.frontend.parsers.tool_calls import StreamDelta, ToolCall, ToolCallDelta, make_call_id


def required_tools_schema(tools: list[tuple[str, dict[str, Any] | None]],
                          parallel: bool = True) -> dict[str, Any]:
    """JSON schema of a ``"required"`` answer: one call (``parallel`` False) or more, each to
    one of the (name, parameters schema) ``tools``."""
    calls = [{"type": "object",
              "properties": {"name": {"const": name},
                             "arguments": params or {"type": "object"}},
              "required": ["name", "arguments"], "additionalProperties": False}
             for name, params in tools]
    schema: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema


@dataclass(slots=True, frozen=True)
class ForcedToolParser:
    """``name`` set: a named function's arguments; None: a ``"required"`` array of calls."""

    name: str | None = None
    id_factory: Callable[[], str] = make_call_id

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of a whole output; content is None when there are calls."""
        parsed = self._parse(text)
        if parsed is None:
            return text or None, []
        return None, [ToolCall(self.id_factory(), name, args) for name, args in parsed]

    def new_stream(self) -> ForcedToolStream:
        return ForcedToolStream(self)

    def _parse(self, text: str) -> list[tuple[str, str]] | None:
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return None
        if self.name is not None:
            return [(self.name, text)] if isinstance(value, dict) else None  # as streamed
        if not isinstance(value, list) or not value:
            return None
        calls = []
        for item in value:
            if not (isinstance(item, dict) and isinstance(item.get("name"), str)
                    and isinstance(item.get("arguments", {}), dict)):
                return None
            calls.append((item["name"], _dump(item.get("arguments", {}))))
        return calls


def _dump(arguments: dict) -> str:
    return json.dumps(arguments, ensure_ascii=False)


@dataclass(slots=True)
class ForcedToolStream:
    """Streaming state. A named call's arguments stream raw as generated (concatenated they are
    the output text, which the grammar made a JSON object); a required array is parsed whole at
    the end, as `extract` does."""

    parser: ForcedToolParser
    _buffer: list[str] = field(default_factory=list)
    _num_calls: int = 0

    @property
    def has_tool_calls(self) -> bool:
        return self._num_calls > 0

    def feed(self, delta: str) -> list[StreamDelta]:
        if self.parser.name is None:
            self._buffer.append(delta)
            return []
        out: list[StreamDelta] = []
        if not self._num_calls:
            self._num_calls = 1
            out.append(ToolCallDelta(0, self.parser.id_factory(), self.parser.name, ""))
        if delta:
            out.append(ToolCallDelta(0, None, None, delta))
        return out

    def finish(self) -> list[StreamDelta]:
        if self.parser.name is not None:
            return []
        content, calls = self.parser.extract("".join(self._buffer))
        self._num_calls = len(calls)
        out: list[StreamDelta] = [content] if content else []
        for index, call in enumerate(calls):
            out.append(ToolCallDelta(index, call.id, call.name, ""))
            out.append(ToolCallDelta(index, None, None, call.arguments))
        return out
