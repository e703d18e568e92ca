"""POST /v1/responses on the chat endpoint's path, and the stored-response routes.

`ResponsesServer.prepare` rebuilds the conversation (the stored ``previous_response_id`` chain,
then the new input), turns it into a chat request (`chat_request`) and
hands that to `ChatServer.prepare`: the same template, tokenization, SamplingParams, forced
tool calls and structured-output constraint as ``/v1/chat/completions``. The engine's text
then goes through the chat parsers into Responses items (`OutputBuilder`), streamed as typed
events or returned whole. A stream with ``return_progress`` (llama-server's option) gets a
``response.in_progress`` event with ``prompt_progress`` after each chunk of the prompt, as
llama-server sends it (frontend/prompt_progress.py). A response with ``store`` (the default)
is kept in the `ResponseStore` once it has finished.

A request's conversation is: the ``instructions`` (a system message, not carried over by
``previous_response_id``, as OpenAI documents), then the stored chain's items (each earlier
response's input and output), then this request's ``input``. Input items map to chat messages:
a message to a message (text parts joined; with ``input_image`` parts, chat text and
``image_url`` parts in order), consecutive ``function_call`` items to one assistant
message's ``tool_calls``, a ``function_call_output`` to a ``tool`` message; a reasoning item's
text becomes the next assistant message's ``reasoning_content`` (the template decides whether
to render it: most drop earlier turns' reasoning; gpt-oss keeps it before a call).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec
from pydantic import ValidationError

from radixserve.frontend.async_llm import NO_TICKET, EngineRequestError, EngineStepError
from radixserve.frontend.core_client import EngineDeadError
from radixserve.frontend.media.chat import check_takes_images
from radixserve.frontend.output_processor import RequestState
from radixserve.frontend.prompt_progress import progress_fields
from radixserve.sampling_params import SamplingParams
from radixserve.frontend.openai.protocol import random_id
from radixserve.frontend.next_turn import Answer
from radixserve.frontend.openai.protocol_chat import ChatCompletionRequest, ChatMessage
from radixserve.frontend.responses.protocol import FunctionChoice, MessageItem, ResponsesRequest
from radixserve.frontend.responses.store import BrokenChain
from radixserve.frontend.responses.output import OutputBuilder
from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.openai.serving import ChatParsers, ServingContext
from radixserve.frontend.openai.serving_chat import ChatServer
from radixserve.frontend.truncation import truncated_details


@dataclass
class ResponsePlan:
    """A validated request ready for the engine."""

    body: ResponsesRequest
    input_items: list[dict]  # this request's own, as stored
    ids: list[int]
    params: SamplingParams
    parsers: ChatParsers
    response_id: str
    created_at: int
    chat: ChatCompletionRequest | None = None  # the chat request it runs as


class ResponsesServer:
    def __init__(self, ctx: ServingContext, chat: ChatServer) -> None:
        self.ctx, self.chat = ctx, chat

    async def prepare(self, body: ResponsesRequest) -> ResponsePlan:
        """Errors (404 for an unknown previous response, 400 for bad input) before queueing."""
        self.ctx.check_model(body.model)
        history: list[dict] = []
        if body.previous_response_id is not None:
            try:
                history = await self.ctx.response_store.conversation(body.previous_response_id)
            except BrokenChain as exc:
                raise OpenAIError(f"Previous response with id '{exc.missing_id}' not found.",
                                  404, param="previous_response_id",
                                  code="previous_response_not_found") from None
        items = stored_items(body.input_items())
        chat_body = chat_request(body, chat_messages(body.instructions, history + items))
        check_takes_images(self.ctx.images is not None, chat_body.messages, "input")
        ids, params, parsers = await self.chat.prepare(chat_body)
        params.return_progress = bool(body.stream) and body.return_progress
        return ResponsePlan(body, items, ids, params, parsers, random_id("resp_"),
                            int(time.time()), chat_body)

    async def full(self, plan: ResponsePlan, arrival: float, ticket=NO_TICKET) -> bytes:
        state = None
        async with contextlib.aclosing(self._generate(plan, arrival, ticket)) as steps:
            async for step in steps:
                state = step.state
        builder = OutputBuilder(plan.parsers.reasoning, plan.parsers.tools)
        builder.feed(state.text)
        builder.finish(_status(state))
        response = self._response(plan, builder, state, _status(state))
        await self._store(plan, response)
        self._warm_next_turn(plan, response, state)
        return msgspec.json.encode(response)

    def stream(self, plan: ResponsePlan, arrival: float, ticket=NO_TICKET) -> ResponseEvents:
        """The typed SSE events; an error after the start becomes an ``error`` event and
        ``response.failed``."""
        return ResponseEvents(self, plan, arrival, ticket)

    def _generate(self, plan: ResponsePlan, arrival: float, ticket):
        return self.ctx.engine.generate(plan.ids, plan.params, plan.response_id,
                                        plan.body.priority, arrival, ticket,
                                        plan.parsers.images)

    async def _store(self, plan: ResponsePlan, response: dict) -> None:
        if plan.body.store is not False and \
                not await self.ctx.response_store.put(response, plan.input_items):
            response["store"] = False  # the write failed (logged): the answer still goes

    def _warm_next_turn(self, plan: ResponsePlan, response: dict, state: RequestState) -> None:
        """The chat route's next-turn warm-up (frontend/next_turn.py), for the answer as the
        next request converts it: its output items, sent back or read from the store."""
        answer = chat_messages(None, response["output"])
        if len(answer) != 1 or answer[0]["role"] != "assistant":
            return
        try:
            message = ChatMessage.model_validate(answer[0])
        except ValueError:  # items no client could send back: nothing to warm
            return
        self.chat.warm_next_turn(plan.chat, state, Answer(
            message.reasoning_content, message.content, message.tool_calls or []))

    def _response(self, plan: ResponsePlan, builder: OutputBuilder,
                  state: RequestState | None, status: str) -> dict:
        """The ``response`` object (see OpenAI's Response); ``usage`` once finished."""
        body, params = plan.body, plan.params
        fmt = body.format().model_dump(exclude_none=True, by_alias=True)
        response = {
            "id": plan.response_id, "object": "response", "created_at": plan.created_at,
            "status": status, "background": False, "error": None,
            "incomplete_details": ({"reason": "max_output_tokens"} if status == "incomplete"
                                   else None),
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "max_tool_calls": None, "model": self.ctx.model_name,
            "output": list(builder.items) if status != "in_progress" else [],
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": body.reasoning and body.reasoning.effort, "summary": None},
            "store": body.store is not False, "temperature": params.temperature,
            "text": {"format": fmt}, "tool_choice": _tool_choice(body),
            "tools": [t.model_dump(exclude_none=True) for t in body.tools or ()],
            "top_p": params.top_p, "truncation": body.truncation or "disabled", "usage": None,
            "user": body.user, "metadata": body.metadata or {},
        }
        if state is not None and status != "in_progress":
            response["usage"] = self._usage(plan, builder, state)
        return response

    def _usage(self, plan: ResponsePlan, builder: OutputBuilder, state: RequestState) -> dict:
        reasoning = builder.reasoning_text()
        # the reasoning text re-encoded: the parser keeps text, not the tokens it came from
        num_reasoning = len(self.ctx.tokenizer.encode(reasoning, add_special_tokens=False)
                            ) if reasoning else 0
        num_out = len(state.token_ids)
        return {"input_tokens": len(plan.ids),
                "input_tokens_details": truncated_details(state.num_cached_tokens,
                                                          plan.parsers.truncation).model_dump(),
                "output_tokens": num_out,
                "output_tokens_details": {"reasoning_tokens": min(num_reasoning, num_out)},
                "total_tokens": len(plan.ids) + num_out}


class ResponseEvents:
    """One streamed response: an async iterator of its SSE events. An engine failure after
    the start ends it with an ``error`` event and ``response.failed``, as does `error_chunk`
    (numbered after the events already sent), which `send_stream` calls for an error the
    events could not yield themselves: the drain's cut (`http.drain`)."""

    def __init__(self, server: ResponsesServer, plan: ResponsePlan, arrival: float,
                 ticket) -> None:
        self.server, self.plan = server, plan
        self.seq = _Sequencer()
        self.builder = OutputBuilder(plan.parsers.reasoning, plan.parsers.tools)
        self.state: RequestState | None = None
        self._events = self._run(arrival, ticket)

    def __aiter__(self) -> ResponseEvents:
        return self

    def __anext__(self):
        return self._events.__anext__()

    def aclose(self):
        return self._events.aclose()

    def error_chunk(self, exc: Exception) -> bytes:
        return self._failed(exc).encode()

    def _failed(self, exc: Exception) -> str:
        message = exc.message if isinstance(exc, OpenAIError) else str(exc)
        failed = self.server._response(self.plan, self.builder, self.state, "failed")
        failed["error"] = {"code": "server_error", "message": message}
        return self.seq.event({"type": "error", "code": "server_error", "message": message,
                               "param": None}) + self.seq.event(
            {"type": "response.failed", "response": failed})

    async def _run(self, arrival: float, ticket) -> AsyncIterator[str]:
        server, plan, seq, builder = self.server, self.plan, self.seq, self.builder
        yield seq.event({"type": "response.created",
                         "response": server._response(plan, builder, None, "in_progress")})
        yield seq.event({"type": "response.in_progress",
                         "response": server._response(plan, builder, None, "in_progress")})
        try:
            async with contextlib.aclosing(server._generate(plan, arrival, ticket)) as steps:
                async for step in steps:
                    if step.progress is not None:  # llama-server's shape for it
                        yield seq.event({"type": "response.in_progress", "response":
                                         server._response(plan, builder, None, "in_progress"),
                                         "prompt_progress": progress_fields(step.progress)})
                        continue
                    self.state = step.state
                    events = builder.feed(step.text)
                    if events:
                        yield "".join(map(seq.event, events))
        except (EngineDeadError, EngineStepError, EngineRequestError, OpenAIError) as exc:
            yield self._failed(exc)
            return
        status = _status(self.state)
        events = builder.finish(status)
        response = server._response(plan, builder, self.state, status)
        await server._store(plan, response)
        server._warm_next_turn(plan, response, self.state)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        yield "".join(map(seq.event, events)) + seq.event({"type": kind, "response": response})


def _status(state: RequestState) -> str:
    return "incomplete" if state.finish_reason == "length" else "completed"


def _tool_choice(body: ResponsesRequest):
    choice = body.tool_choice
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else choice.model_dump()


class _Sequencer:
    """Numbers the events of one stream and writes them as SSE."""

    def __init__(self) -> None:
        self.next = 0

    def event(self, payload: dict) -> str:
        payload["sequence_number"] = self.next
        self.next += 1
        return f"event: {payload['type']}\ndata: {msgspec.json.encode(payload).decode()}\n\n"


# ----------------------------------------------------------------------------- to chat


def stored_items(items: list) -> list[dict]:
    """Input items as stored and listed by ``input_items``: dicts with an id and a status."""
    out = []
    for item in items:
        d = item.model_dump(exclude_none=True, by_alias=True)
        if isinstance(item, MessageItem):
            d["content"] = ([{"type": "input_text" if item.role != "assistant" else
                              "output_text", "text": item.content}]
                            if isinstance(item.content, str) else d["content"])
            prefix = "msg_"
        else:
            prefix = {"function_call": "fc_", "function_call_output": "fco_",
                      "reasoning": "rs_"}[item.type]
        d.setdefault("id", random_id(prefix))
        d.setdefault("status", "completed")
        out.append(d)
    return out


def chat_messages(instructions: str | None, items: list[dict]) -> list[dict]:
    """Chat messages of a conversation given as stored item dicts (see the module docstring)."""
    messages: list[dict] = [{"role": "system", "content": instructions}] if instructions else []
    reasoning = None  # a reasoning item's text, for the assistant message it precedes
    for item in items:
        kind = item.get("type", "message")
        if kind == "reasoning":
            reasoning = _text(item.get("content") or [])
        elif kind == "message":
            messages.append({"role": item["role"], "content": _content(item["content"])})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                # "" not None: templates without tool support index message.content
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": _text(item["output"])})
        if (kind != "reasoning" and reasoning is not None and messages
                and messages[-1]["role"] == "assistant"):
            messages[-1]["reasoning_content"], reasoning = reasoning, None
    return messages


def _text(content) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content)


def _content(content) -> str | list[dict]:
    """A message item's content as chat content: its text, or with ``input_image`` parts
    the chat parts in order (text and ``image_url``)."""
    if isinstance(content, str) or all(p.get("type") != "input_image" for p in content):
        return _text(content)
    return [{"type": "image_url", "image_url": {"url": part["image_url"],
                                                **({"detail": part["detail"]}
                                                   if part.get("detail") else {})}}
            if part.get("type") == "input_image" else {"type": "text", "text": part["text"]}
            for part in content]


def chat_request(body: ResponsesRequest, messages: list[dict]) -> ChatCompletionRequest:
    """The chat request that generates this response (never streamed: the caller streams)."""
    fmt = body.format()
    fields: dict[str, Any] = {
        "model": body.model, "messages": messages, "max_completion_tokens":
        body.max_output_tokens, "temperature": body.temperature, "top_p": body.top_p,
        "top_k": body.top_k, "seed": body.seed, "ignore_eos": body.ignore_eos,
        "priority": body.priority, "parallel_tool_calls": body.parallel_tool_calls,
        "reasoning_effort": body.reasoning and body.reasoning.effort,
        "truncate_prompt_tokens": -1 if body.truncation == "auto" else None,
    }
    if body.tools:
        fields["tools"] = [{"type": "function", "function": t.model_dump(
            exclude_none=True, exclude={"type"})} for t in body.tools]
    if isinstance(body.tool_choice, FunctionChoice):
        fields["tool_choice"] = {"type": "function", "function": {"name": body.tool_choice.name}}
    elif body.tool_choice is not None:
        fields["tool_choice"] = body.tool_choice
    if fmt.type == "json_object":
        fields["response_format"] = {"type": "json_object"}
    elif fmt.type == "json_schema":
        fields["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.name, "description": fmt.description, "schema": fmt.schema_,
            "strict": fmt.strict}}
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:  # e.g. a tool message without its call: the input is bad
        first = exc.errors()[0]
        raise OpenAIError(f"the conversation is not valid: {first['msg']}",
                          param="input") from None
