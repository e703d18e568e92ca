"""One sample's output as Responses API items and typed stream events.

`OutputBuilder` takes the text the engine produced, piece by piece, through the chat endpoint's
parsers (`serving.ChoiceStream`: reasoning first, then tool calls), and turns each chat
delta into items: reasoning text into a ``reasoning`` item, content into a ``message`` item
with one ``output_text`` part, each tool call into a ``function_call`` item. A new kind of
delta closes the open item. The events a piece produces are returned as plain dicts without
``sequence_number`` (the stream numbers them); a whole response feeds its text in one piece and
keeps only `items`. Item boundaries follow the parsers' delta kinds, which do not depend on how
the text was split, so the streamed items equal the whole response's items.
"""

from __future__ import annotations

from radixserve.frontend.openai.protocol import random_id
from radixserve.frontend.openai.serving import ChoiceStream

_REASONING, _MESSAGE, _CALL = "reasoning", "message", "function_call"


class OutputBuilder:
    def __init__(self, reasoning_parser, tool_parser) -> None:
        self._parsers = ChoiceStream(reasoning_parser, tool_parser)
        self.items: list[dict] = []
        self._kind: str | None = None  # the open item's kind; it is items[-1]
        self._text: list[str] = []  # the open item's text (or arguments) so far

    @property
    def has_tool_calls(self) -> bool:
        return any(item["type"] == _CALL for item in self.items)

    def reasoning_text(self) -> str:
        return "".join(part["text"] for item in self.items if item["type"] == _REASONING
                       for part in item["content"])

    def feed(self, text: str) -> list[dict]:
        """Add a piece of the output; return the events it completes."""
        return self._route(self._parsers.feed(text))

    def finish(self, status: str = "completed") -> list[dict]:
        """End the output: flush the parsers, close the open item with ``status``."""
        events = self._route(self._parsers.finish())
        return events + self._close(status)

    def _route(self, deltas) -> list[dict]:
        events: list[dict] = []
        for delta in deltas:
            if delta.reasoning_content:
                events += self._append(_REASONING, delta.reasoning_content)
            if delta.content:
                events += self._append(_MESSAGE, delta.content)
            for call in delta.tool_calls or ():
                if call.id is not None:  # a new call's header
                    events += self._close("completed")
                    events += self._open_call(call.id, call.function.name)
                if call.function.arguments:
                    events += self._append(_CALL, call.function.arguments)
        return events

    def _append(self, kind: str, text: str) -> list[dict]:
        events = []
        if self._kind != kind:
            events += self._close("completed") + self._open(kind)
        self._text.append(text)
        item = self.items[-1]
        if kind == _CALL:
            events.append({"type": "response.function_call_arguments.delta",
                           "item_id": item["id"], "output_index": len(self.items) - 1,
                           "delta": text})
        else:
            event = {"type": _DELTA[kind], "item_id": item["id"],
                     "output_index": len(self.items) - 1, "content_index": 0, "delta": text}
            if kind == _MESSAGE:
                event["logprobs"] = []
            events.append(event)
        return events

    def _open(self, kind: str) -> list[dict]:
        if kind == _REASONING:
            item = {"id": random_id("rs_"), "type": "reasoning", "summary": [], "content": [],
                    "status": "in_progress"}
        else:
            item = {"id": random_id("msg_"), "type": "message", "role": "assistant",
                    "status": "in_progress", "content": []}
        self.items.append(item)
        self._kind, self._text = kind, []
        index = len(self.items) - 1
        return [{"type": "response.output_item.added", "output_index": index,
                 "item": _copy(item)},
                {"type": "response.content_part.added", "item_id": item["id"],
                 "output_index": index, "content_index": 0, "part": _part(kind, "")}]

    def _open_call(self, call_id: str, name: str) -> list[dict]:
        item = {"id": random_id("fc_"), "type": "function_call", "status": "in_progress",
                "call_id": call_id, "name": name, "arguments": ""}
        self.items.append(item)
        self._kind, self._text = _CALL, []
        return [{"type": "response.output_item.added", "output_index": len(self.items) - 1,
                 "item": dict(item)}]

    def _close(self, status: str) -> list[dict]:
        kind = self._kind
        if kind is None:
            return []
        self._kind = None
        item, index, text = self.items[-1], len(self.items) - 1, "".join(self._text)
        item["status"] = status
        events = []
        if kind == _CALL:
            item["arguments"] = text
            events.append({"type": "response.function_call_arguments.done",
                           "item_id": item["id"], "output_index": index, "name": item["name"],
                           "arguments": text})
        else:
            part = _part(kind, text)
            item["content"] = [part]
            done = {"type": _DONE[kind], "item_id": item["id"], "output_index": index,
                    "content_index": 0, "text": text}
            if kind == _MESSAGE:
                done["logprobs"] = []
            events += [done, {"type": "response.content_part.done", "item_id": item["id"],
                              "output_index": index, "content_index": 0, "part": dict(part)}]
        events.append({"type": "response.output_item.done", "output_index": index,
                       "item": _copy(item)})
        return events


_DELTA = {_REASONING: "response.reasoning_text.delta", _MESSAGE: "response.output_text.delta"}
_DONE = {_REASONING: "response.reasoning_text.done", _MESSAGE: "response.output_text.done"}


def _part(kind: str, text: str) -> dict:
    if kind == _REASONING:
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _copy(item: dict) -> dict:
    """A snapshot of an item for an event (the item itself changes as it fills)."""
    return {**item, "content": [dict(p) for p in item["content"]]} if "content" in item else (
        dict(item))
