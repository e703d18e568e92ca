"""POST /v1/chat/completions: the model's chat template in, assistant messages out.

Each sample's text goes through the reasoning parser (``<think>`` → ``reasoning_content``)
and then the tool-call parser (``<tool_call>`` → ``tool_calls``) when those are active; the
streamed deltas add up to the non-streamed message.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator

from radixserve.frontend.async_llm import NO_TICKET, QueueTicket
from radixserve.frontend.chat_images import render_chat_images
from radixserve.frontend.fanout import gate_on_reasoning
from radixserve.frontend.next_turn import Answer, AnswerTape
from radixserve.frontend.http.asgi_io import SSE_DONE
from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.media.chat import check_takes_images, load_chat_images
from radixserve.frontend.openai.chat_render import render_messages
from radixserve.frontend.openai.protocol import UsageInfo, random_id
from radixserve.frontend.openai.protocol_chat import (ChatCompletionChoice, ChatCompletionMessage,
                                                      ChatCompletionRequest,
                                                      ChatCompletionResponse,
                                                      ChatCompletionStreamResponse, ChatLogprobs,
                                                      ChatTokenLogprob, ChatTopLogprob,
                                                      DeltaMessage, FunctionCall, ToolCall)
from radixserve.frontend.openai.protocol_chat import ChatCompletionStreamChoice as StreamChoice
from radixserve.frontend.openai.response_size import (chat_terms, check_response_size,
                                                     off_loop_if_large)
from radixserve.frontend.openai.serving import (TEXT_MARK, ChatParsers, ChunkTemplate,
                                                ServingContext, sse, token_bytes)
from radixserve.frontend.output_processor import RequestState
from radixserve.frontend.prompt_progress import chat_progress_event
from radixserve.frontend.parsers import ForcedToolParser, required_tools_schema
from radixserve.frontend.parsers.hermes import FORMAT as HERMES
from radixserve.frontend.parsers.lenient_json import LenientToolParser
from radixserve.frontend.parsers.tool_grammar import auto_tools_grammar
from radixserve.frontend.truncation import (Truncation, fit_chat, log_truncation, prompt_limit,
                                            truncated_details)
from radixserve.structured.backend import GrammarError
from radixserve.messages import ImageInput
from radixserve.structured.params import StructuredOutputsParams

logger = logging.getLogger(__name__)


def _forced_tools(body: ChatCompletionRequest):
    """(ForcedToolParser, constraint) for a forced tool_choice, else None."""
    choice = body.tool_choice
    if not body.tools or choice is None or isinstance(choice, str) and choice != "required":
        return None
    tools = {t.function.name: t.function.parameters for t in body.tools}
    if isinstance(choice, str):  # "required"
        schema = required_tools_schema(list(tools.items()), body.parallel_tool_calls is not False)
        return ForcedToolParser(None), StructuredOutputsParams(json=schema)
    name = choice.function.name
    return ForcedToolParser(name), StructuredOutputsParams(json=tools[name] or {"type": "object"})


class ChatServer:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def prepare(self, body: ChatCompletionRequest):
        """(prompt ids, SamplingParams, `ChatParsers`); errors before queueing. The template
        and the tokenizer run off the event loop (`PromptPrep`). The reasoning parser is the
        server's set for the rendered prompt: a template that opened the think block
        (Qwen3.5 with thinking on) starts the output in reasoning, one that closed it
        (``enable_thinking: false``) does not.

        A forced ``tool_choice`` (``"required"`` or a named function) becomes a JSON-schema
        constraint on the output, read back by a `ForcedToolParser`; ``"auto"`` needs the
        server's tool-call parser. With a reasoning parser, a constraint starts after the
        reasoning section unless ``structured_outputs.after_reasoning`` is false. The
        request's reasoning budget, if any, goes with the params (frontend/reasoning_budget.py).
        """
        ctx = self.ctx
        ctx.check_model(body.model)
        forced = _forced_tools(body)
        use_tools = bool(body.tools) and body.tool_choice != "none"
        if use_tools and forced is None and ctx.tool_parser is None:
            raise OpenAIError("tool calling needs a tool-call parser: start the server with "
                              "--tool-call-parser hermes (or force a call with tool_choice)",
                              param="tools")
        text, ids, cut, images = await chat_prompt_ids(ctx, body)
        params = ctx.sampling_params(body, len(ids))
        tool_parser = ctx.tool_parser if use_tools else None
        if forced is not None:
            if params.structured_outputs is not None:
                raise OpenAIError("a forced tool_choice cannot be combined with response_format "
                                  "or structured_outputs", param="tool_choice")
            tool_parser, constraint = forced
            params.structured_outputs = constraint
        elif use_tools:
            # answers written as bare or fenced JSON are calls too (parsers/lenient_json.py)
            tool_parser = LenientToolParser(
                tool_parser, {t.function.name: t.function.parameters for t in body.tools},
                body.parallel_tool_calls is not False)
            if params.structured_outputs is None:
                params.structured_outputs = await self._auto_tools(body)
        reasoning = ctx.reasoning_parser.for_prompt(text) if ctx.reasoning_parser else None
        params = gate_on_reasoning(params, reasoning, text, ctx.tokenizer)
        params = ctx.reasoning_budget.apply(params, body.thinking_token_budget,
                                            body.reasoning_effort, reasoning, text, ctx.tokenizer)
        log_truncation("chat", cut, len(ids))
        return ids, params, ChatParsers(reasoning, tool_parser, cut, images)

    async def _auto_tools(self, body: ChatCompletionRequest) -> StructuredOutputsParams | None:
        """The grammar of a ``tool_choice: "auto"`` answer in the Hermes format (text, or
        text and well-formed calls: parsers/tool_grammar.py), or None: another format, the
        grammar turned off, or tool schemas the grammar cannot hold (the answer is then free,
        as without the grammar; logged)."""
        ctx = self.ctx
        if not ctx.tool_call_grammar or ctx.tool_parser.format is not HERMES:
            return None
        tools = [(t.function.name, t.function.parameters) for t in body.tools]
        constraint = StructuredOutputsParams(grammar=auto_tools_grammar(
            tools, body.parallel_tool_calls is not False))
        try:
            await ctx.grammar_validator.check(constraint)
        except GrammarError as exc:
            logger.warning("tool_choice auto without its grammar (the tools' schemas: %s)", exc)
            return None
        return constraint

    async def full(self, body: ChatCompletionRequest, ids, params, parsers: ChatParsers,
                   arrival: float, ticket: QueueTicket = NO_TICKET) -> ChatCompletionResponse:
        request_id = random_id("chatcmpl-")
        finals: dict[int, RequestState] = {}
        async with contextlib.aclosing(
            self.ctx.engine.generate(ids, params, request_id, body.priority, arrival, ticket,
                                     parsers.images)
        ) as steps:
            async for step in steps:
                if step.state.finished:
                    finals[step.index] = step.state
        build = functools.partial(self._response, ids, parsers, request_id, finals)
        response = await off_loop_if_large(self.response_bytes(params), build)
        if params.n == 1:
            message = response.choices[0].message
            self.warm_next_turn(body, finals[0], Answer(message.reasoning_content,
                                                        message.content,
                                                        message.tool_calls or []))
        return response

    def warm_next_turn(self, body, state: RequestState, answer: Answer) -> None:
        """Prefill the next turn's prefix when the template drops ``answer``'s reasoning
        from the history (frontend/next_turn.py); returns at once."""
        self.ctx.next_turn.after(self.ctx, functools.partial(render_messages, self.ctx), body,
                                 state, answer)

    def response_bytes(self, params, limit: int | None = None, stream: bool = False) -> int:
        """The answer's estimated bytes (`response_size`); 400 naming the parameters and
        their product beyond ``limit``."""
        return check_response_size(
            chat_terms(params.n, params.max_tokens, params.logprobs, stream), limit)

    def _response(self, ids, parsers: ChatParsers, request_id: str,
                  finals: dict[int, RequestState]) -> ChatCompletionResponse:
        """The whole answer from the finished samples (may run on a worker thread: it only
        reads them; the parsers' ``extract`` keeps no state)."""
        choices = []
        for index in sorted(finals):
            state = finals[index]
            reasoning, content, calls = parsers.extract(state.text)
            finish = "tool_calls" if calls else state.finish_reason
            message = ChatCompletionMessage(content=content, reasoning_content=reasoning,
                                            tool_calls=[ToolCall(id=c.id, function=FunctionCall(
                                                name=c.name, arguments=c.arguments))
                                                for c in calls] or None)
            choices.append(ChatCompletionChoice(
                index=index, message=message, finish_reason=finish, stop_reason=state.stop_reason,
                logprobs=_logprobs(state, 0) if state.logprobs is not None else None))
        return ChatCompletionResponse(id=request_id, model=self.ctx.model_name, choices=choices,
                                      usage=_usage(len(ids), list(finals.values()), parsers))

    async def stream(self, body: ChatCompletionRequest, ids, params, parsers: ChatParsers,
                     arrival: float, ticket: QueueTicket = NO_TICKET) -> AsyncIterator[str]:
        request_id = random_id("chatcmpl-")
        created = int(time.time())
        model = self.ctx.model_name
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        templates: dict[int, ChunkTemplate] = {}  # per choice: its plain content chunk

        def chunk(index, delta, finish=None, logprobs=None, stop_reason=None):
            if (finish is None and logprobs is None and delta.content
                    and delta.role is None and delta.reasoning_content is None
                    and delta.tool_calls is None):
                template = templates.get(index)
                if template is None:
                    template = templates[index] = ChunkTemplate(ChatCompletionStreamResponse(
                        id=request_id, created=created, model=model,
                        choices=[StreamChoice(index=index,
                                              delta=DeltaMessage(content=TEXT_MARK))]))
                return template.sse(delta.content)
            return sse(ChatCompletionStreamResponse(
                id=request_id, created=created, model=model,
                choices=[StreamChoice(index=index, delta=delta, logprobs=logprobs,
                                      finish_reason=finish, stop_reason=stop_reason)]))

        for i in range(params.n):
            yield chunk(i, DeltaMessage(role="assistant", content=""))
        streams = {}
        states: dict[int, RequestState] = {}
        unfinished = params.n
        tail = ""  # the last choice's finish chunk, sent with the end of the stream
        tape = AnswerTape() if params.n == 1 else None  # the answer, for `warm_next_turn`
        async with contextlib.aclosing(
            self.ctx.engine.generate(ids, params, request_id, body.priority, arrival, ticket,
                                     parsers.images)
        ) as steps:
            async for step in steps:
                if step.progress is not None:
                    yield chat_progress_event(request_id, created, model, step.index,
                                              step.progress)
                    continue
                state = states[step.index] = step.state
                if step.index not in streams:
                    streams[step.index] = parsers.stream()
                cs = streams[step.index]
                deltas = cs.feed(step.text)
                if state.finished:
                    deltas += cs.finish()
                logprobs = None
                if state.logprobs is not None:
                    logprobs = _logprobs(state,
                                         len(state.token_ids) - len(step.output.new_token_ids))
                for delta in deltas:
                    if tape is not None:
                        tape.add(delta)
                    yield chunk(step.index, delta, logprobs=logprobs)
                    logprobs = None
                if logprobs is not None:
                    yield chunk(step.index, DeltaMessage(), logprobs=logprobs)
                if state.finished:
                    finish = "tool_calls" if cs.has_tool_calls else state.finish_reason
                    event = chunk(step.index, DeltaMessage(), finish,
                                  stop_reason=state.stop_reason)
                    unfinished -= 1
                    if unfinished:
                        yield event
                    else:
                        tail = event
        if tape is not None and states:
            self.warm_next_turn(body, states[0], tape.answer())
        if include_usage:
            tail += sse(ChatCompletionStreamResponse(
                id=request_id, created=created, model=model, choices=[],
                usage=_usage(len(ids), list(states.values()), parsers)))
        yield tail + SSE_DONE  # one write ends the response


def _usage(num_prompt: int, states: list[RequestState], parsers: ChatParsers) -> UsageInfo:
    num_completion = sum(len(s.token_ids) for s in states)
    cached = max((s.num_cached_tokens for s in states), default=0)
    details = truncated_details(cached, parsers.truncation)
    if parsers.images:
        details.image_tokens = sum(image.length for image in parsers.images)
    return UsageInfo(prompt_tokens=num_prompt, completion_tokens=num_completion,
                     total_tokens=num_prompt + num_completion, prompt_tokens_details=details)


async def chat_prompt_ids(ctx: ServingContext, body
                          ) -> tuple[str, list[int], Truncation | None, list[ImageInput]]:
    """(the rendered prompt, its ids, what truncation cut, its images): the whole chat, after
    the length check, or (``truncate_prompt_tokens`` set) the chat with its oldest turns left
    out until it fits the request's limit (frontend/truncation.py). Off the event loop. A chat
    with images has them loaded (frontend/media/) and placed (frontend/chat_images.py)."""
    limit = prompt_limit(body.truncate_prompt_tokens, ctx.max_model_len,
                         body.requested_max_tokens())
    if any(m.images() for m in body.messages):
        return await _chat_with_images(ctx, body, limit)
    if limit is None:
        ctx.prep.check_messages(body.messages)
        text, ids = await ctx.prep.chat_prompt(lambda: render_messages(ctx, body))
        return text, ids, None, []

    def render(kept: list[int]) -> tuple[str, list[int]]:
        text = render_messages(ctx, body, kept)
        return text, ctx.tokenizer.encode_prompt(text)

    return (*await ctx.prep.run(fit_chat, body.messages, render, limit, ctx.max_model_len),
            [])


async def _chat_with_images(ctx: ServingContext, body, limit: int | None
                            ) -> tuple[str, list[int], None, list[ImageInput]]:
    """`chat_prompt_ids` for a chat whose messages carry images: each loaded within the
    server's media policy, then the template rendered and the images placed; a 400 for an
    image the model cannot take, and for truncation (not done with images yet)."""
    check_takes_images(ctx.images is not None, body.messages)
    if limit is not None:
        raise OpenAIError("truncate_prompt_tokens is not supported with images yet",
                          param="truncate_prompt_tokens")
    ctx.prep.check_messages(body.messages)
    images = await load_chat_images(body.messages, ctx.media)
    try:
        text, ids, inputs = await ctx.prep.run(render_chat_images, ctx, body, images)
    except (ValueError, OSError) as exc:  # (a Pillow error on a decoded image: OSError)
        raise OpenAIError(str(exc), param="messages") from exc
    return text, ids, None, inputs


def _logprobs(state: RequestState, start: int) -> ChatLogprobs:
    content = []
    for token_id, entry in zip(state.token_ids[start:], state.logprobs[start:]):
        chosen = entry[token_id]
        tops = sorted((lp for lp in entry.values() if lp.rank is not None), key=lambda lp: lp.rank)
        content.append(ChatTokenLogprob(
            token=chosen.decoded_token, logprob=chosen.logprob,
            bytes=token_bytes(chosen.decoded_token),
            top_logprobs=[ChatTopLogprob(token=lp.decoded_token, logprob=lp.logprob,
                                         bytes=token_bytes(lp.decoded_token)) for lp in tops]))
    return ChatLogprobs(content=content)
