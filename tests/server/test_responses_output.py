"""Responses items and events from the chat parsers, and Responses input → chat messages,
without a server."""

from __future__ import annotations

import random

import pytest

from radixserve.frontend.parsers import ReasoningParser, ToolCallParser
from radixserve.frontend.responses.protocol import ResponsesRequest
from radixserve.frontend.responses.serving import chat_messages, stored_items
from radixserve.frontend.responses.output import OutputBuilder

TEXT = ("<think>\nfirst I look up the weather\n</think>\n\nLet me check."
        '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\nDone.')


def _run(pieces: list[str]) -> tuple[list[dict], list[dict]]:
    ids = iter(f"call_{i}" for i in range(100))
    builder = OutputBuilder(ReasoningParser(), ToolCallParser(id_factory=lambda: next(ids)))
    events = []
    for piece in pieces:
        events += builder.feed(piece)
    events += builder.finish()
    return builder.items, events


def _without_ids(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k != "id"} for item in items]


def test_items_of_reasoning_text_and_calls():
    items, events = _run([TEXT])
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call",
                                          "function_call", "message"]
    assert items[0]["content"] == [{"type": "reasoning_text",
                                    "text": "first I look up the weather"}]
    assert items[1]["content"][0]["text"] == "Let me check."
    assert (items[2]["name"], items[2]["arguments"], items[2]["call_id"]) == (
        "get_weather", '{"city": "Paris"}', "call_0")
    assert (items[3]["name"], items[3]["arguments"]) == ("get_time", "{}")
    # the chat parser keeps whitespace between two pieces of text (calls cut out of it)
    assert items[4]["content"][0]["text"] == "\n\n\nDone."
    assert all(i["status"] == "completed" for i in items)
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["output_index"] for e in events if e["type"] == "response.output_item.done"]
    assert added == done == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("seed", range(20))
def test_streamed_equals_whole_for_any_chunking(seed):
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(TEXT)), rng.randint(1, 40)))
    pieces = [TEXT[a:b] for a, b in zip([0, *cuts], [*cuts, len(TEXT)])]
    whole, _ = _run([TEXT])
    streamed, events = _run(pieces)
    assert _without_ids(streamed) == _without_ids(whole)
    # the deltas of each item add up to its done event's text
    for index, item in enumerate(streamed):
        deltas = "".join(e["delta"] for e in events if e.get("output_index") == index
                         and e["type"].endswith(".delta"))
        final = item["arguments"] if item["type"] == "function_call" else (
            item["content"][0]["text"])
        assert deltas == final


def test_an_incomplete_output_closes_its_item_as_incomplete():
    builder = OutputBuilder(None, None)
    builder.feed("partial answ")
    events = builder.finish("incomplete")
    assert builder.items[0]["status"] == "incomplete"
    assert events[-1]["item"]["status"] == "incomplete"
    assert [e["type"] for e in events] == ["response.output_text.done",
                                          "response.content_part.done",
                                          "response.output_item.done"]


def test_input_items_become_chat_messages():
    body = ResponsesRequest.model_validate({"input": [
        {"role": "user", "content": "weather in Paris?"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text",
                                                          "text": "hm"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "20 C"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "noon"}]},
    ]})
    items = stored_items(body.input_items())
    assert all(item["id"] and item["status"] == "completed" for item in items)
    assert chat_messages("be brief", items) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "hm", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "c2", "type": "function",
             "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "20 C"},
        {"role": "tool", "tool_call_id": "c2", "content": "noon"},
    ]


def test_a_string_input_is_one_user_message():
    items = stored_items(ResponsesRequest(input="hi").input_items())
    assert [(i["type"], i["role"], i["content"]) for i in items] == [
        ("message", "user", [{"type": "input_text", "text": "hi"}])]
