"""Keep the branch the next chat turn will ask for (issue 59, item 5).

A reasoning model answers turn n with ``<think>…</think>answer``; the radix cache then holds
prompt_n + that output. Templates that drop earlier reasoning (Qwen3 before the last user
query, DeepSeek-R1, QwQ always) render turn n+1's history without it, so the cache hits only up
to the start of that assistant message and the whole answer is prefilled again on turn n+1.

When such an answer finishes, `NextTurnWarmer.after` renders what turn n+1's prompt will start
with (the request's messages, the answer as the client sends it back: content and tool calls,
no reasoning, then the next message's header) and prefills it as a prompt-only request at the
lowest priority, so its KV is in the cache when turn n+1 comes:

    turn n+1:  [ prompt_n ..... | answer (no reasoning) | next message header | new text ]
    cached:    [ prompt_n ..... | <think>…</think>answer ]          <- hit stops at the answer
    warm-up:   [ prompt_n ..... | answer (no reasoning) | next message header ]

It runs at most once per finished request, only when it adds tokens the cache lacks, never
past the context window, never while requests wait for the engine, and not at all with
``--no-warm-next-turn``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily

from radixserve.frontend.openai.protocol_chat import (
    ChatMessage,
    DeltaMessage,
    FunctionCall,
    ToolCall,
)
from radixserve.frontend.output_buffer import OutputBuffer
from radixserve.messages import EngineCoreRequest
from radixserve.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

LOWEST_PRIORITY = 2**62  # the scheduler runs larger values last and preempts them first
MIN_GAIN_TOKENS = 16  # a warm-up adding fewer uncached tokens is not worth a request
MAX_IN_FLIGHT = 2  # warm-ups running at once; more are dropped
MAX_WAITING = 0  # requests waiting for the engine beyond which a warm-up is dropped
# two next-message texts that differ from their first character: the renders agree up to it
_PLACEHOLDERS = ("\ue001", "\ue002")
# texts a next message may start with, to find a last token that would merge with it
_TAILS = (_PLACEHOLDERS[0], "a", "A", " ", "\n", "<")
_FAILED = ("abort", "error")  # finish reasons of answers no client sends back


@dataclass(slots=True)
class Answer:
    """One finished sample as the client sends it back: ``reasoning`` (None: none),
    ``content`` and its tool calls, with the ids the client got."""

    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)

    def message(self, with_reasoning: bool) -> ChatMessage:
        return ChatMessage(role="assistant", content=self.content,
                           tool_calls=self.tool_calls or None,
                           reasoning_content=self.reasoning if with_reasoning else None)


class AnswerTape:
    """Adds up one streamed sample's chat deltas into its `Answer`."""

    def __init__(self) -> None:
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._calls: dict[int, list] = {}  # index -> [id, name, argument pieces]

    def add(self, delta: DeltaMessage) -> None:
        if delta.reasoning_content:
            self._reasoning.append(delta.reasoning_content)
        if delta.content:
            self._content.append(delta.content)
        for piece in delta.tool_calls or ():
            call = self._calls.setdefault(piece.index, [None, None, []])
            call[0] = call[0] or piece.id
            if piece.function is not None:
                call[1] = call[1] or piece.function.name
                call[2].append(piece.function.arguments or "")

    def answer(self) -> Answer:
        calls = [ToolCall(id=cid, function=FunctionCall(name=name or "", arguments="".join(args)))
                 for cid, name, args in (self._calls[i] for i in sorted(self._calls))]
        return Answer("".join(self._reasoning) or None, "".join(self._content), calls)


def next_turn_text(render: Callable[[object], str], body, answer: Answer,
                   with_reasoning: bool = False) -> str:
    """What the next turn's rendered prompt starts with: ``body``'s messages, the answer and
    the header of the message that follows it (the tool results for a tool call, else a user
    message). ``render(body)`` is the chat template as the request's route applies it; the
    text is cut where two renders with different next-message texts part."""
    history = [*body.messages, answer.message(with_reasoning)]

    def rendered(word: str) -> str:
        after = ([ChatMessage(role="tool", content=word, tool_call_id=c.id)
                  for c in answer.tool_calls] or [ChatMessage(role="user", content=word)])
        return render(body.model_copy(update={"messages": history + after,
                                              "add_generation_prompt": True,
                                              "continue_final_message": False}))

    first, second = (rendered(word) for word in _PLACEHOLDERS)
    return first[:_common_len(first, second)]


def next_turn_ids(render: Callable[[object], str], encode: Callable[[str], list[int]], body,
                  answer: Answer) -> list[int] | None:
    """The token ids the next turn's prompt will start with, tokenized as that prompt will be
    (``encode``: the route's prompt tokenizer); None when the template keeps the reasoning in
    the history (the cache holds the branch already). The ids are those the text shares with
    longer texts' ids: a last token that merges with the next message's text is left out.
    Runs the template four times: call it off the event loop."""
    text = next_turn_text(render, body, answer)
    if next_turn_text(render, body, answer, with_reasoning=True) != text:
        return None
    ids = encode(text)
    return ids[:min(_common_len(ids, encode(text + tail)) for tail in _TAILS)]


def _is_plain_turn(body) -> bool:
    """Whether the next turn's prompt starts as `next_turn_text` renders it: not when the
    request continued its last message or may have had its oldest turns cut to fit."""
    return (body.add_generation_prompt and not body.continue_final_message
            and body.truncate_prompt_tokens is None)


def _common_len(a, b) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


class NextTurnWarmer:
    """Prefills the next turn's prefix after a chat answer whose template drops its reasoning.

    ``after`` is called once per finished chat request, on the event loop; it starts at most
    one background warm-up and never raises. Counters (read by `collector`): warm-ups
    submitted, prompt tokens they prefilled (not found in the cache), warm-ups dropped
    because the engine was busy.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.is_enabled = enabled
        self.num_submitted = 0
        self.num_prefilled_tokens = 0
        self.num_dropped_busy = 0
        self._tasks: set[asyncio.Task] = set()

    def after(self, ctx, render: Callable[[object], str], body, state, answer: Answer) -> None:
        """Start the warm-up for ``answer``, the sample ``state`` (a finished `RequestState`)
        wrote for ``body``, when it can add something; ``render``: the route's chat template
        (`next_turn_ids`)."""
        if (not self.is_enabled or not answer.reasoning or state.finish_reason in _FAILED
                or not _is_plain_turn(body)):
            return
        task = asyncio.ensure_future(self._warm(ctx, render, body, state, answer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _warm(self, ctx, render, body, state, answer: Answer) -> None:
        try:
            ids = await ctx.prep.run(next_turn_ids, render, ctx.tokenizer.encode_prompt, body,
                                     answer)
            if ids is None or len(ids) >= ctx.max_model_len:
                return
            cached = state.prompt_token_ids + state.token_ids  # what the radix cache holds
            if len(ids) - _common_len(ids, cached) < MIN_GAIN_TOKENS:
                return
            client = ctx.engine.client
            if client.stats.num_waiting > MAX_WAITING or len(self._tasks) > MAX_IN_FLIGHT:
                self.num_dropped_busy += 1
                return
            self.num_submitted += 1
            num_cached = await _prefill(client, ids, state.params.lora_name)
            self.num_prefilled_tokens += len(ids) - num_cached
        except Exception as exc:  # noqa: BLE001 - a warm-up never fails anything else
            logger.debug("next-turn warm-up skipped: %s", exc)

    async def drain(self) -> None:
        """Wait for the warm-ups in flight to end."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def collector(self, model_name: str) -> NextTurnCollector:
        return NextTurnCollector(self, model_name)


async def _prefill(client, ids: list[int], lora_name: str | None) -> int:
    """Prefill ``ids`` as a prompt-only request (``max_tokens`` 0) at the lowest priority;
    the number of its tokens found in the cache. Aborts it if cancelled before it ends."""
    rid = f"warm-next-turn-{os.urandom(8).hex()}"
    buffer = OutputBuffer()
    await client.add_request(EngineCoreRequest(
        request_id=rid, prompt_token_ids=ids,
        sampling_params=SamplingParams(max_tokens=0, lora_name=lora_name),
        arrival_time=time.time(), priority=LOWEST_PRIORITY), buffer)
    try:
        while True:
            for item in await buffer.take():
                if isinstance(item, BaseException):
                    raise item
                if item.request_id == rid and item.finish_reason is not None:
                    if item.error is not None:
                        raise RuntimeError(item.error)
                    rid = None
                    return item.num_cached_tokens
    finally:
        if rid is not None:
            await client.abort([rid])


class NextTurnCollector:
    """/metrics: the warmer's counters, read at scrape time."""

    def __init__(self, warmer: NextTurnWarmer, model_name: str) -> None:
        self.warmer = warmer
        self.model = model_name

    def collect(self):
        rows = (("next_turn_warmups", ("Next-turn warm-ups submitted (prefills of the history "
                 "a reasoning template re-renders without its reasoning)."), "num_submitted"),
                ("next_turn_warmup_tokens", "Prompt tokens the next-turn warm-ups prefilled.",
                 "num_prefilled_tokens"),
                ("next_turn_warmups_dropped", "Next-turn warm-ups dropped: the engine was busy.",
                 "num_dropped_busy"))
        for name, doc, attr in rows:
            family = CounterMetricFamily(f"radixserve:{name}", doc, labels=["model_name"])
            family.add_metric([self.model], getattr(self.warmer, attr))
            yield family
