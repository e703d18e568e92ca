"""The next turn's prefix (frontend/next_turn.py), rendered with real reasoning templates.

With the tiny byte-level BPE tokenizer and the public templates (Qwen3, DeepSeek-R1 distill,
QwQ: llama.cpp's copies in tests/chat_templates/), `next_turn_ids` must be exactly the first
ids of the next request's own prompt, whatever the client's next message says; None when the
template keeps the reasoning (Qwen3 inside a tool loop); and an `AnswerTape` fed a stream's
deltas gives the answer the non-streamed response holds.
"""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from types import SimpleNamespace

import pytest
from tiny_models import _tokenizer_json
from tokenizers import Tokenizer as HFTokenizer

from radixserve.core.reports import EngineCoreOutput
from radixserve.frontend.anthropic.blocks import BlockAssembler
from radixserve.frontend.anthropic.protocol import MessagesRequest
from radixserve.frontend.anthropic.serving import MessagesServer
from radixserve.frontend.next_turn import (
    LOWEST_PRIORITY,
    Answer,
    AnswerTape,
    NextTurnWarmer,
    next_turn_ids,
    next_turn_text,
)
from radixserve.frontend.openai.protocol_chat import (
    ChatCompletionRequest,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    ToolCall,
)
from radixserve.frontend.openai.chat_render import render_messages
from radixserve.frontend.parsers import get_reasoning_parser
from radixserve.frontend.responses.output import OutputBuilder
from radixserve.frontend.responses.protocol import ResponsesRequest
from radixserve.frontend.responses.serving import (
    ResponsesServer,
    chat_messages,
    chat_request,
    stored_items,
)
from radixserve.messages import EngineCoreRequest
from radixserve.tokenizer.tokenizer import Tokenizer

TEMPLATES = Path(__file__).parent / "chat_templates"
# the templates that drop earlier reasoning, and the header the prefix must end with
DROPPING = {"Qwen-Qwen3-0.6B.jinja": "<|im_end|>\n<|im_start|>user\n",
            "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "<｜end▁of▁sentence｜><｜User｜>",
            "Qwen-QwQ-32B.jinja": "<|im_end|>\n<|im_start|>user\n"}
REASONING = "The user greets me. I should answer briefly and ask what they need."
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def _ctx(name: str) -> SimpleNamespace:
    tokenizer = Tokenizer(HFTokenizer.from_str(_tokenizer_json()),
                          chat_template=(TEMPLATES / name).read_text())
    return SimpleNamespace(tokenizer=tokenizer)  # all `render_messages` reads


def _body(*messages: dict, tools=None) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": list(messages), "tools": tools})


def _next_prompt(ctx, body, answer: Answer, after: list[dict]) -> list[int]:
    """The ids of the request a client sends next: the answer (no reasoning) and ``after``."""
    sent = {"role": "assistant", "content": answer.content}
    if answer.tool_calls:
        sent["tool_calls"] = [c.model_dump() for c in answer.tool_calls]
    nxt = body.model_copy(update={"messages": [*body.messages, _body(sent).messages[0],
                                               *_body(*after).messages]})
    return ctx.tokenizer.encode_prompt(render_messages(ctx, nxt))


@pytest.mark.parametrize("name", DROPPING)
@pytest.mark.parametrize("follow_up", ["Thanks! Now tell me a joke.", "\nok", " x", "<b>hi</b>"])
def test_prefix_is_the_next_prompts_start(name, follow_up):
    ctx = _ctx(name)
    body = _body({"role": "system", "content": "You are terse."},
                 {"role": "user", "content": "Hello there"})
    answer = Answer(REASONING, "Hi! What do you need?")
    render = functools.partial(render_messages, ctx)
    ids = next_turn_ids(render, ctx.tokenizer.encode_prompt, body, answer)
    assert ids is not None
    full = _next_prompt(ctx, body, answer, [{"role": "user", "content": follow_up}])
    assert ids == full[:len(ids)]
    text = next_turn_text(render, body, answer)
    assert "Hi! What do you need?" in text and REASONING not in text
    assert text.endswith("Hi! What do you need?" + DROPPING[name])
    # the prefix runs past the answer: every id of the text, or all but a merging last one
    assert len(ids) >= len(ctx.tokenizer.encode_prompt(text)) - 1


def test_qwen3_keeps_reasoning_inside_a_tool_loop():
    """After a tool call, Qwen3's template renders the call's reasoning (it follows the last
    user query): the cache already holds that branch, nothing to warm."""
    ctx = _ctx("Qwen-Qwen3-0.6B.jinja")
    body = _body({"role": "user", "content": "Weather in Paris?"}, tools=TOOLS)
    call = ToolCall(id="call1", function=FunctionCall(name="get_weather",
                                                      arguments='{"city": "Paris"}'))
    answer = Answer(REASONING, "", [call])
    render = functools.partial(render_messages, ctx)
    assert next_turn_ids(render, ctx.tokenizer.encode_prompt, body, answer) is None
    # the same answer to DeepSeek-R1's template, which always drops it, is warmed
    r1 = _ctx("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
    ids = next_turn_ids(functools.partial(render_messages, r1), r1.tokenizer.encode_prompt,
                        body, answer)
    full = _next_prompt(r1, body, answer,
                        [{"role": "tool", "tool_call_id": "call1", "content": "22 C"}])
    assert ids and ids == full[:len(ids)]


def test_answer_tape_adds_up_stream_deltas():
    tape = AnswerTape()
    for delta in [DeltaMessage(role="assistant", content=""),
                  DeltaMessage(reasoning_content="Think "), DeltaMessage(reasoning_content="more"),
                  DeltaMessage(content="Calling."),
                  DeltaMessage(tool_calls=[DeltaToolCall(index=0, id="c0", type="function",
                               function=DeltaFunctionCall(name="f", arguments='{"a"'))]),
                  DeltaMessage(tool_calls=[DeltaToolCall(
                      index=0, function=DeltaFunctionCall(arguments=': 1}'))])]:
        tape.add(delta)
    answer = tape.answer()
    assert answer.reasoning == "Think more" and answer.content == "Calling."
    assert [(c.id, c.function.name, c.function.arguments) for c in answer.tool_calls] == [
        ("c0", "f", '{"a": 1}')]
    assert AnswerTape().answer() == Answer(None, "", [])


# ----------------------------------------------------------------------------- the warmer


class _Client:
    """An engine client that finishes every request at once, ``num_cached`` tokens cached."""

    def __init__(self, num_waiting: int = 0, num_cached: int = 5) -> None:
        self.stats = SimpleNamespace(num_waiting=num_waiting)
        self.num_cached = num_cached
        self.sent: list[EngineCoreRequest] = []

    async def add_request(self, request: EngineCoreRequest, buffer) -> int:
        self.sent.append(request)
        buffer.put(EngineCoreOutput(request.request_id, [], "length",
                                    num_cached_tokens=self.num_cached))
        return 0

    async def abort(self, request_ids) -> None:
        raise AssertionError("nothing to abort")


async def _run(fn, *args):
    return fn(*args)


def _warm(answer: Answer, enabled=True, num_waiting=0, max_model_len=4096, tools=None,
          output_is_next_prefix=False, truncate=None) -> tuple[NextTurnWarmer, _Client, list]:
    """Run one warm-up after ``answer`` to a one-question Qwen3 chat: (the warmer, the
    client it sent to, the ids `next_turn_ids` gives). ``output_is_next_prefix``: the
    sample's output ids run on to the end of those ids (as under a template keeping them)."""
    ctx = _ctx("Qwen-Qwen3-0.6B.jinja")
    client = _Client(num_waiting)
    ctx.prep = SimpleNamespace(run=_run)
    ctx.max_model_len = max_model_len
    ctx.engine = SimpleNamespace(client=client)
    body = _body({"role": "user", "content": "Hello there"}, tools=tools)
    body.truncate_prompt_tokens = truncate
    render = functools.partial(render_messages, ctx)
    ids = next_turn_ids(render, ctx.tokenizer.encode_prompt, body, answer)
    prompt = ctx.tokenizer.encode_prompt(render(body))
    if output_is_next_prefix:
        assert ids[:len(prompt)] == prompt
    output = ids[len(prompt):] if output_is_next_prefix else ctx.tokenizer.encode_prompt("out")
    state = SimpleNamespace(prompt_token_ids=prompt, finish_reason="stop", token_ids=output,
                            params=SimpleNamespace(lora_name="adapter"))
    warmer = NextTurnWarmer(enabled)

    async def main():
        warmer.after(ctx, render, body, state, answer)
        await warmer.drain()

    asyncio.run(main())
    return warmer, client, ids


def test_warmer_prefills_the_next_prefix_last():
    warmer, client, ids = _warm(Answer(REASONING, "Hi! What do you need? " * 3))
    [sent] = client.sent
    assert sent.prompt_token_ids == ids and sent.priority == LOWEST_PRIORITY
    assert sent.sampling_params.max_tokens == 0  # prompt-only: prefilled, nothing sampled
    assert sent.sampling_params.lora_name == "adapter"  # the answer's KV namespace
    assert (warmer.num_submitted, warmer.num_prefilled_tokens) == (1, len(ids) - 5)
    families = {f.name: f.samples[0].value for f in warmer.collector("m").collect()}
    assert families == {"radixserve:next_turn_warmups": 1,
                        "radixserve:next_turn_warmup_tokens": len(ids) - 5,
                        "radixserve:next_turn_warmups_dropped": 0}


@pytest.mark.parametrize("case", ["no reasoning", "tool loop keeps it", "off", "busy",
                                  "over the context", "cached already", "may be truncated"])
def test_warmer_skips(case):
    answer = Answer(REASONING, "Hi! What do you need? " * 3)
    kwargs = {}
    if case == "no reasoning":
        answer = Answer(None, answer.content)
    elif case == "tool loop keeps it":
        answer = Answer(REASONING, "", [ToolCall(id="c", function=FunctionCall(
            name="get_weather", arguments="{}"))])
        kwargs["tools"] = TOOLS
    elif case == "off":
        kwargs["enabled"] = False
    elif case == "busy":
        kwargs["num_waiting"] = 1
    elif case == "over the context":
        kwargs["max_model_len"] = 20
    elif case == "may be truncated":  # its next turn may lose its oldest messages
        kwargs["truncate"] = 1000
    else:
        kwargs["output_is_next_prefix"] = True
    warmer, client, _ = _warm(answer, **kwargs)
    assert client.sent == [] and warmer.num_submitted == 0
    assert warmer.num_dropped_busy == (case == "busy")


def test_responses_answer_is_what_the_next_request_renders():
    """The Responses route warms the answer as its output items come back (sent again or read
    from the store through ``previous_response_id``): the prefix must start the next
    response's own prompt."""
    ctx = _ctx("Qwen-Qwen3-0.6B.jinja")
    first = ResponsesRequest.model_validate(
        {"model": "m", "instructions": "You are terse.", "input": "Hello there"})
    items = stored_items(first.input_items())
    builder = OutputBuilder(get_reasoning_parser("qwen3"), None)
    builder.feed(f"<think>\n{REASONING}\n</think>\n\nHi! What do you need?")
    builder.finish("completed")
    captured = []
    server = ResponsesServer(ctx, SimpleNamespace(warm_next_turn=lambda *a: captured.append(a)))
    plan = SimpleNamespace(chat=chat_request(first, chat_messages(first.instructions, items)))
    server._warm_next_turn(plan, {"output": builder.items}, "the state")
    [(chat, state, answer)] = captured
    assert state == "the state" and answer.reasoning.strip() == REASONING.strip()
    render = functools.partial(render_messages, ctx)
    ids = next_turn_ids(render, ctx.tokenizer.encode_prompt, chat, answer)
    second = ResponsesRequest.model_validate(
        {"model": "m", "instructions": "You are terse.", "input": "Thanks!"})
    history = items + builder.items + stored_items(second.input_items())
    full = ctx.tokenizer.encode_prompt(render(chat_request(second, chat_messages(
        second.instructions, history))))
    assert ids and ids == full[:len(ids)]
    # all but the new question (and the header's last token, if it merges with text)
    question = ctx.tokenizer.encode_prompt("Thanks!<|im_end|>\n<|im_start|>assistant\n")
    assert len(full) - len(ids) <= len(question) + 1


def test_anthropic_answer_is_what_the_next_request_renders():
    """The Messages route warms the answer's content blocks as the client sends them back
    (thinking, text, tool_use), converted as the next request converts them."""
    ctx = _ctx("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
    ask = {"model": "m", "max_tokens": 64, "system": "You are terse.", "tools": [{
        "name": "get_weather", "input_schema": {"type": "object"}}]}
    first = MessagesRequest.model_validate(
        {**ask, "messages": [{"role": "user", "content": "Weather in Paris?"}]})
    blocks = BlockAssembler()
    for delta in [DeltaMessage(reasoning_content=REASONING), DeltaMessage(content="Checking."),
                  DeltaMessage(tool_calls=[DeltaToolCall(index=0, id="toolu_1", type="function",
                               function=DeltaFunctionCall(name="get_weather",
                                                          arguments='{"city": "Paris"}'))])]:
        blocks.add(delta)
    blocks.close()
    captured = []
    server = MessagesServer(ctx, SimpleNamespace(warm_next_turn=lambda *a: captured.append(a)))
    server.warm_next_turn(first, "the state", blocks.blocks)
    [(chat, _, answer)] = captured
    assert answer.reasoning == REASONING and answer.tool_calls[0].id == "toolu_1"
    render = functools.partial(render_messages, ctx)
    ids = next_turn_ids(render, ctx.tokenizer.encode_prompt, chat, answer)
    second = MessagesRequest.model_validate({**ask, "messages": [
        *first.model_dump(exclude_none=True)["messages"],
        {"role": "assistant", "content": blocks.blocks},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "22 C"}]}]})
    full = ctx.tokenizer.encode_prompt(render(second.to_chat()))
    assert ids and ids == full[:len(ids)]
    assert "Checking." in ctx.tokenizer.decode(ids) and REASONING not in ctx.tokenizer.decode(ids)
