"""POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages API on the chat
pipeline.

A Messages request becomes a chat request (`MessagesRequest.to_chat`) and is prepared by the
chat server itself (template, tools, a forced ``tool_choice`` as structured output, sampling
checks); the engine's text goes through the chat's per-sample parsers, whose deltas
`BlockAssembler` turns into Anthropic blocks, whole or as stream events. Errors use
Anthropic's shape (`anthropic_error_response`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import msgspec

from radixserve.frontend.async_llm import NO_TICKET, EngineRequestError, QueueTicket
from radixserve.frontend.output_processor import RequestState
from radixserve.frontend.prompt_progress import progress_fields
from radixserve.frontend.anthropic.blocks import (
    MESSAGE_STOP, PING, BlockAssembler, event, stop_reason, usage)
from radixserve.frontend.http.errors import error_headers, error_response, send_json
from radixserve.frontend.media.chat import check_takes_images
from radixserve.frontend.openai.protocol import random_id
from radixserve.frontend.anthropic.protocol import CountTokensRequest, Message, MessagesRequest
from radixserve.frontend.next_turn import Answer
from radixserve.frontend.openai.serving import ChatParsers, ServingContext
from radixserve.frontend.openai.chat_render import render_messages
from radixserve.frontend.openai.serving_chat import ChatServer
from radixserve.frontend.reasoning_budget import can_budget

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
                408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
                500: "api_error", 503: "overloaded_error", 504: "timeout_error",
                529: "overloaded_error"}


def anthropic_error_body(status: int, message: str) -> dict:
    """``{"type": "error", "error": {"type", "message"}}``, the type named for ``status``."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def anthropic_error_response(exc: Exception) -> tuple[int, dict | None]:
    """(status, Anthropic error body) for ``exc``: the status and message the OpenAI routes
    give (`errors.error_response`), the offending field named in the message."""
    if isinstance(exc, EngineRequestError):
        return 400, anthropic_error_body(400, str(exc))
    status, body = error_response(exc)
    if body is None:
        return status, None
    message, param = body["error"]["message"], body["error"].get("param")
    if param and param not in message:
        message = f"{param}: {message}"
    return status, anthropic_error_body(status, message)


async def send_anthropic_error(send, exc: Exception) -> None:
    status, body = anthropic_error_response(exc)
    await send_json(send, status, msgspec.json.encode(body) if body is not None else b"",
                    error_headers(exc))


def stream_error_event(exc: Exception) -> str:
    """The ``error`` event that ends a stream which failed after it started."""
    _, body = anthropic_error_response(exc)
    return event("error", {"error": body["error"]})


class MessagesServer:
    def __init__(self, ctx: ServingContext, chat: ChatServer | None = None) -> None:
        self.ctx = ctx
        self.chat = chat or ChatServer(ctx)

    async def prepare(self, body: MessagesRequest):
        """(prompt ids, SamplingParams, `ChatParsers`), as `ChatServer.prepare`. Without a
        tag-based reasoning parser ``thinking.budget_tokens`` is dropped, not refused:
        clients send it with every thinking request, as the switch ``enable_thinking`` reads."""
        chat = body.to_chat()
        check_takes_images(self.ctx.images is not None, chat.messages)
        if not can_budget(self.ctx.reasoning_parser):
            chat.thinking_token_budget = None
        return await self.chat.prepare(chat)

    async def count_tokens(self, body: CountTokensRequest) -> bytes:
        """``{"input_tokens": n}``: the prompt a Messages request with these fields gets."""
        self.ctx.check_model(body.model)
        chat = body.to_chat()
        check_takes_images(self.ctx.images is not None, chat.messages)
        self.ctx.prep.check_messages(chat.messages)
        _, ids = await self.ctx.prep.chat_prompt(lambda: render_messages(self.ctx, chat))
        return msgspec.json.encode({"input_tokens": len(ids)})

    def _generate(self, ids, params, message_id: str, arrival: float, ticket: QueueTicket,
                  images: list = ()):
        return contextlib.aclosing(
            self.ctx.engine.generate(ids, params, message_id, 0, arrival, ticket, images))

    def _message(self, message_id: str, content: list, reason, sequence, usage_: dict) -> dict:
        return {"id": message_id, "type": "message", "role": "assistant",
                "model": self.ctx.model_name, "content": content, "stop_reason": reason,
                "stop_sequence": sequence, "usage": usage_}

    def _start(self, message_id: str, num_prompt: int, num_cached: int) -> str:
        """``message_start`` (its usage: the prompt, split by the prefix-cache hit) and a
        ``ping``."""
        start_usage = {"input_tokens": num_prompt - num_cached, "cache_creation_input_tokens": 0,
                       "cache_read_input_tokens": num_cached, "output_tokens": 0}
        return event("message_start", {"message": self._message(
            message_id, [], None, None, start_usage)}) + PING

    def warm_next_turn(self, body: MessagesRequest | None, state: RequestState,
                       blocks: list[dict]) -> None:
        """The chat route's next-turn warm-up (frontend/next_turn.py) for the answer's
        content blocks, as the next request converts them when the client sends them back."""
        if body is None or not blocks:
            return
        try:
            [message] = Message(role="assistant", content=blocks).chat_messages()
        except ValueError:  # blocks no client could send back: nothing to warm
            return
        self.chat.warm_next_turn(body.to_chat(), state, Answer(
            message.reasoning_content, message.content, message.tool_calls or []))

    async def full(self, ids, params, parsers: ChatParsers, arrival: float,
                   ticket: QueueTicket = NO_TICKET, body: MessagesRequest | None = None
                   ) -> bytes:
        message_id = random_id("msg_")
        state: RequestState | None = None
        async with self._generate(ids, params, message_id, arrival, ticket,
                                  parsers.images) as steps:
            async for step in steps:
                state = step.state
        stream = parsers.stream()
        blocks = BlockAssembler()
        for delta in stream.feed(state.text) + stream.finish():
            blocks.add(delta)
        blocks.close()
        reason, sequence = stop_reason(state, blocks.has_tool_calls)
        self.warm_next_turn(body, state, blocks.blocks)
        return msgspec.json.encode(self._message(message_id, blocks.blocks, reason, sequence,
                                                 usage(len(ids), state)))

    async def stream(self, ids, params, parsers: ChatParsers, arrival: float,
                     ticket: QueueTicket = NO_TICKET, body: MessagesRequest | None = None
                     ) -> AsyncIterator[str]:
        """The event stream, one write per engine step. ``message_start`` waits for the first
        step, so its usage knows the prefix-cache hit; ``message_delta`` carries the final
        usage and the stop reason. With ``return_progress``, each prompt progress report is
        a ``ping`` event holding ``prompt_progress`` (pings may come anywhere after
        ``message_start``, and SDKs skip them); the first one sends ``message_start``."""
        message_id = random_id("msg_")
        stream = parsers.stream()
        blocks = BlockAssembler()
        started = False
        async with self._generate(ids, params, message_id, arrival, ticket,
                                  parsers.images) as steps:
            async for step in steps:
                state = step.state
                out: list[str] = []
                if step.progress is not None:
                    if not started:
                        started = True
                        out.append(self._start(message_id, step.progress.total,
                                               step.progress.cache))
                    yield "".join(out) + event("ping", {
                        "prompt_progress": progress_fields(step.progress)})
                    continue
                if not started:
                    started = True
                    out.append(self._start(message_id, len(ids), state.num_cached_tokens))
                deltas = stream.feed(step.text)
                if state.finished:
                    deltas += stream.finish()
                for delta in deltas:
                    out += blocks.add(delta)
                if state.finished:
                    out += blocks.close()
                    self.warm_next_turn(body, state, blocks.blocks)
                    reason, sequence = stop_reason(state, blocks.has_tool_calls)
                    out += [event("message_delta", {
                        "delta": {"stop_reason": reason, "stop_sequence": sequence},
                        "usage": usage(len(ids), state)}), MESSAGE_STOP]
                yield "".join(out)
