"""The Anthropic blocks built from the chat parsers' deltas: streamed events add up to the whole
message's content for any chunking (text, thinking, tool calls), and the protocol mapping."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from pydantic import ValidationError

from radixserve.frontend.parsers import ForcedToolParser, get_reasoning_parser, get_tool_parser
from radixserve.frontend.anthropic.blocks import BlockAssembler
from radixserve.frontend.anthropic.protocol import CountTokensRequest, MessagesRequest
from radixserve.frontend.openai.serving import ChoiceStream

OUTPUTS = [
    "plain text only",
    "<think>let me think\nabout it</think>\n\nThe answer is 4.",
    "<think>need a tool</think>I'll check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
    'before <tool_call>\n{"name": "f", "arguments": {"x": [1, 2]}}\n</tool_call> after',
    "<tool_call>not json</tool_call> kept as text",
    "",
]


def _ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def _blocks(text: str, chunks: list[str], tool_parser) -> tuple[list[dict], list[dict]]:
    """(whole content, content accumulated from the stream's events)."""
    reasoning = get_reasoning_parser("think")
    whole = BlockAssembler()
    parsers = ChoiceStream(reasoning, tool_parser(_ids()))
    for d in parsers.feed(text) + parsers.finish():
        whole.add(d)
    whole.close()
    streamed, events = BlockAssembler(), []
    parsers = ChoiceStream(reasoning, tool_parser(_ids()))
    for i, chunk in enumerate(chunks):
        deltas = parsers.feed(chunk) + (parsers.finish() if i == len(chunks) - 1 else [])
        for d in deltas:
            events += streamed.add(d)
    events += streamed.close()
    return whole.blocks, _accumulate(events)


def _accumulate(events: list[str]) -> list[dict]:
    """A client's view of the events: blocks started, deltas appended, JSON parsed at stop."""
    content, json_bufs, open_ = [], {}, None
    for raw in events:
        kind_line, data_line = raw.strip("\n").split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert kind_line == f"event: {data['type']}"
        if data["type"] == "content_block_start":
            assert open_ is None and data["index"] == len(content)
            content.append(dict(data["content_block"]))
            open_ = data["index"]
        elif data["type"] == "content_block_delta":
            assert data["index"] == open_
            delta, block = data["delta"], content[data["index"]]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            else:
                assert delta["type"] == "input_json_delta"
                json_bufs[open_] = json_bufs.get(open_, "") + delta["partial_json"]
        else:
            assert data["type"] == "content_block_stop" and data["index"] == open_
            if open_ in json_bufs:
                content[open_]["input"] = json.loads(json_bufs[open_])
            open_ = None
    assert open_ is None
    return content


def _chunkings(text: str, rng: random.Random):
    yield [text]
    yield list(text) or [""]
    for _ in range(5):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, 6))) if text else []
        yield [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def _hermes(ids):
    return get_tool_parser("hermes", id_factory=ids)


@pytest.mark.parametrize("text", OUTPUTS)
def test_streamed_events_add_up_to_the_whole_content(text):
    rng = random.Random(len(text))
    for chunks in _chunkings(text, rng):
        whole, streamed = _blocks(text, chunks, _hermes)
        assert streamed == whole, chunks


def test_block_kinds_and_order():
    whole, _ = _blocks(OUTPUTS[2], [OUTPUTS[2]], _hermes)
    assert [b["type"] for b in whole] == ["thinking", "text", "tool_use", "tool_use"]
    assert whole[0] == {"type": "thinking", "thinking": "need a tool", "signature": ""}
    assert whole[1] == {"type": "text", "text": "I'll check."}
    assert whole[2] == {"type": "tool_use", "id": "call_0", "name": "get_weather",
                        "input": {"city": "Paris"}}
    assert whole[3]["input"] == {}
    assert _blocks("", [""], _hermes)[0] == []


def test_forced_named_tool_streams_its_arguments():
    text = '{"city": "Rome", "unit": "celsius"}'
    forced = lambda ids: ForcedToolParser("get_weather", ids)  # noqa: E731
    for chunks in _chunkings(text, random.Random(0)):
        whole, streamed = _blocks(text, chunks, forced)
        assert whole == streamed == [{"type": "tool_use", "id": "call_0", "name": "get_weather",
                                      "input": {"city": "Rome", "unit": "celsius"}}]


BASE = {"model": "m", "max_tokens": 5}


def test_conversation_maps_to_chat_messages():
    body = MessagesRequest.model_validate({**BASE, "system": [{"type": "text", "text": "A"},
                                                              {"type": "text", "text": "B"}],
        "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"], "temperature": 0, "top_k": 3,
        "metadata": {"user_id": "u1"}, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "text", "text": "calling"},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1",
                 "content": [{"type": "text", "text": "42"}]},
                {"type": "tool_result", "tool_use_id": "t2", "content": "bad", "is_error": True},
                {"type": "text", "text": "thanks", "cache_control": {"type": "ephemeral"}}]}]})
    chat = body.to_chat()
    assert [(m.role, m.content) for m in chat.messages] == [
        ("system", "A\nB"), ("user", "hi"), ("assistant", "calling"), ("tool", "42"),
        ("tool", "Error: bad"), ("user", "thanks")]
    assistant = chat.messages[2]
    assert assistant.reasoning_content == "hmm"
    assert assistant.tool_calls[0].id == "t1"
    assert json.loads(assistant.tool_calls[0].function.arguments) == {"a": 1}
    assert [m.tool_call_id for m in chat.messages[3:5]] == ["t1", "t2"]
    assert chat.tool_choice == "required" and chat.parallel_tool_calls is False
    assert (chat.stop, chat.temperature, chat.top_k, chat.max_tokens, chat.user) == (
        ["END"], 0, 3, 5, "u1")
    named = MessagesRequest.model_validate({**BASE, "messages": [{"role": "user",
                                                                  "content": "x"}],
        "tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "tool",
                                                                      "name": "f"}})
    assert named.to_chat().tool_choice.function.name == "f"


@pytest.mark.parametrize("body, words", [
    ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({**BASE, "messages": []}, "messages"),
    ({**BASE, "messages": [{"role": "system", "content": "x"}]}, "role"),
    ({**BASE, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "image"),
    ({**BASE, "messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]}, "tool_use blocks"),
    ({**BASE, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "any"}},
     "needs tools"),
    ({**BASE, "messages": [{"role": "user", "content": "x"}],
      "tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "tool",
                                                                    "name": "g"}}, "'g'"),
    ({**BASE, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5},
     "temperature"),
    ({**BASE, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
     "top_logprobs"),
])
def test_bad_requests_name_the_problem(body, words):
    with pytest.raises(ValidationError, match=words):
        MessagesRequest.model_validate(body)


def test_count_tokens_takes_no_sampling_fields():
    with pytest.raises(ValidationError, match="max_tokens"):
        CountTokensRequest.model_validate({**BASE, "messages": [{"role": "user",
                                                                 "content": "x"}]})
