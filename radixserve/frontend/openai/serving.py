"""What the generation endpoints share: the served model, request checks, SSE, and the chat
parsers of one request (`ChatParsers`) and of one sample (`ChoiceStream`: chat, Responses and
Anthropic build on it)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import msgspec

from radixserve.frontend.async_llm import AsyncLLM
from radixserve.frontend.batch_encoder import BatchEncoder
from radixserve.frontend.core_client import EngineDeadError
from radixserve.frontend.next_turn import NextTurnWarmer
from radixserve.frontend.media.policy import MediaPolicy
from radixserve.frontend.parsers import ReasoningParser, ToolCallDelta, ToolCallParser
from radixserve.frontend.pooling import EmbeddingSetup
from radixserve.frontend.reasoning_budget import BudgetPolicy
from radixserve.frontend.rerank import Reranker
from radixserve.frontend.truncation import Truncation
from radixserve.sampling_params import SamplingParams
from radixserve.frontend.http.protocol_base import OpenAIError, ParamError
from radixserve.frontend.openai.protocol import SamplingRequest
from radixserve.frontend.openai.protocol_chat import DeltaFunctionCall, DeltaMessage, DeltaToolCall
from radixserve.frontend.openai.response_size import DEFAULT_MAX_RESPONSE_MB, MB
from radixserve.frontend.responses.store import ResponseStore
from radixserve.structured.backend import GrammarError
from radixserve.structured.validator import GrammarValidator


@dataclass
class ServingContext:
    engine: AsyncLLM
    model_name: str
    max_n: int = 16
    tool_parser: ToolCallParser | None = None
    reasoning_parser: ReasoningParser | None = None
    grammar_validator: GrammarValidator = field(default_factory=GrammarValidator)
    structured_strict: bool = True  # what a JSON schema without "strict" gets
    max_prompts_per_request: int = 128  # a /v1/completions prompt list's longest length
    embedding: EmbeddingSetup = EmbeddingSetup(None, "this server does not serve embeddings")
    model_path: str | None = None  # the GGUF file or model folder (Ollama's model routes)
    response_store: ResponseStore = field(default_factory=ResponseStore)  # /v1/responses
    tool_call_grammar: bool = True  # tool_choice auto under a grammar (parsers/tool_grammar.py)
    reranker: Reranker | None = None  # with --task rerank: /v1/rerank, /v1/score
    loras: dict[str, str] = field(default_factory=dict)  # LoRA adapters: name → path
    # a generation answer's largest estimated size (--max-response-mb; None: no limit)
    max_response_bytes: int | None = DEFAULT_MAX_RESPONSE_MB * MB
    # reasoning budgets: --reasoning-budget, its message, --reasoning-effort-budgets
    reasoning_budget: BudgetPolicy = field(default_factory=BudgetPolicy)
    # the next turn's prefix prefilled after a reasoning answer (--no-warm-next-turn: off)
    next_turn: NextTurnWarmer = field(default_factory=NextTurnWarmer)
    # where images may come from and how large (--allowed-media-path, --allow-remote-media...)
    media: MediaPolicy = field(default_factory=MediaPolicy)
    images: object | None = None  # the model's image processor; None: it takes text only

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @functools.cached_property
    def encoder(self) -> BatchEncoder:
        """Prompt tokenization off the event loop (long texts batched on a worker thread)."""
        return BatchEncoder(self.engine.tokenizer)

    @functools.cached_property
    def prep(self):
        """Templating and tokenizing large prompts off the event loop, after a length check
        (a `PromptPrep`)."""
        from radixserve.frontend.http.prompt_prep import PromptPrep

        return PromptPrep(self.engine.tokenizer, self.engine.max_model_len)

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def check_alive(self) -> None:
        """503 up front (not a 200 stream carrying an error) when the engine is gone."""
        if self.engine.client.dead:
            raise EngineDeadError(self.engine.client.dead)

    def check_model(self, model: str | None) -> str | None:
        """404 naming the served models unless ``model`` is None, the served model or a
        loaded LoRA adapter (``NAME`` or ``BASE:NAME``); the adapter's name, else None."""
        if model is None or model == self.model_name:
            return None
        name = model.removeprefix(f"{self.model_name}:")
        if name in self.loras:
            return name
        listed = ", ".join([self.model_name, *sorted(self.loras)])
        raise OpenAIError(f"The model `{model}` does not exist. Available: {listed}.", 404,
                          "NotFoundError", "model", "model_not_found")

    def lora_for(self, body: SamplingRequest) -> str | None:
        """The LoRA adapter a request names: its ``lora`` field, else its model; 404 for an
        adapter that is not loaded."""
        if body.lora is None:
            return self.check_model(body.model)
        if body.lora not in self.loras:
            raise OpenAIError(f"The LoRA adapter `{body.lora}` does not exist. Loaded: "
                              f"{sorted(self.loras)}.", 404, "NotFoundError", "lora",
                              "model_not_found")
        return body.lora

    def sampling_params(self, body: SamplingRequest, num_prompt_tokens: int,
                        prompt_param: str = "messages") -> SamplingParams:
        """SamplingParams for one prompt; 400 if it cannot fit the context window (naming
        ``prompt_param``, the route's prompt field, when the prompt alone fills it). Without
        ``max_tokens`` the completion may fill what the prompt leaves."""
        if num_prompt_tokens == 0:
            raise OpenAIError("the prompt is empty", param="prompt")
        room = self.max_model_len - num_prompt_tokens
        asked = body.requested_max_tokens()
        if room < 1 or (asked is not None and asked > room):
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {num_prompt_tokens + (asked or 1)} tokens ({num_prompt_tokens} "
                f"in the prompt, {asked or 1} in the completion). Please reduce the length of "
                f"the prompt or completion.", param="max_tokens" if room >= 1 else prompt_param,
                code="context_length_exceeded")
        params = body.to_sampling_params(default_max_tokens=room)
        params.lora_name = self.lora_for(body)
        if params.n > self.max_n:
            raise ParamError("n", f"n must be <= {self.max_n}, got {params.n}")
        params.validate_vocab(self.tokenizer.vocab_size)
        return params

    async def check_structured(self, param: str, params: list[SamplingParams]) -> None:
        """400 naming ``param`` if a structured-output spec is invalid (checked off the
        event loop, under a time limit). Sets an unset ``strict`` to the server's default
        first, so the engine compiles what was checked."""
        for p in params:
            if p.structured_outputs is not None:
                if p.structured_outputs.strict is None:
                    p.structured_outputs.strict = self.structured_strict
                try:
                    await self.grammar_validator.check(p.structured_outputs)
                except GrammarError as exc:
                    raise OpenAIError(str(exc), param=param) from None


def sse(payload) -> str:
    data = payload if isinstance(payload, str) else payload.model_dump_json()
    return f"data: {data}\n\n"


TEXT_MARK = "\ue000radixserve-text\ue000"  # stands for the text in a `ChunkTemplate`


class ChunkTemplate:
    """The SSE event of a stream chunk whose only varying part is one text field.

    Built once per response (and choice) from a response model holding `TEXT_MARK` in that
    field; each token then splices its JSON-encoded text in, instead of building and
    serialising a pydantic model per token. Same JSON as ``sse(model)`` with the text set.
    """

    def __init__(self, model) -> None:
        mark = msgspec.json.encode(TEXT_MARK).decode()
        head, found, tail = model.model_dump_json().partition(mark)
        assert found, "the model does not hold TEXT_MARK"
        self._head, self._tail = f"data: {head}", f"{tail}\n\n"

    def sse(self, text: str) -> str:
        return self._head + msgspec.json.encode(text).decode() + self._tail


async def merge(iterators: list[AsyncIterator]) -> AsyncIterator:
    """Interleave several async iterators as their items arrive."""
    if len(iterators) == 1:
        async with contextlib.aclosing(iterators[0]) as it:
            async for item in it:
                yield item
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(it):
        try:
            async with contextlib.aclosing(it):
                async for item in it:
                    await queue.put(item)
            await queue.put(done)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
            await queue.put(exc)

    tasks = [asyncio.ensure_future(pump(it)) for it in iterators]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def token_bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))


@dataclass(frozen=True, slots=True)
class ChatParsers:
    """One chat request's output parsers, plain data: the server's reasoning parser set for
    the request's rendered prompt (`ReasoningParser.for_prompt`: whether the template opened
    the block) and the tool-call parser its tools call for (a `ToolCallParser` or one of its
    shape: lenient, forced). None turns that parsing off. Stateless, shared by the request's
    samples; `stream` gives one sample its streaming state. ``truncation``: what was cut from
    the request's prompt to fit (frontend/truncation.py), which its answer reports;
    ``images``: the prompt's images, which go to the engine with its ids."""

    reasoning: ReasoningParser | None = None
    tools: ToolCallParser | None = None
    truncation: Truncation | None = None
    images: list = field(default_factory=list)  # the prompt's (messages.ImageInput), to send

    def stream(self) -> ChoiceStream:
        return ChoiceStream(self.reasoning, self.tools)

    def extract(self, text: str) -> tuple[str | None, str, list]:
        """(reasoning_content, content, tool calls) of a whole sample, as `stream` adds up."""
        reasoning, content = self.reasoning.extract(text) if self.reasoning else (None, text)
        if self.tools is None:
            return reasoning, content, []
        content, calls = self.tools.extract(content)
        return reasoning, content, calls


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
