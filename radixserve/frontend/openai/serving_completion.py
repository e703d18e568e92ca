"""POST /v1/completions: text in, text out, streamed (SSE) or whole."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator

from radixserve.frontend.async_llm import NO_TICKET, QueueTicket, StepDelta
from radixserve.frontend.output_processor import RequestState
from radixserve.frontend.prompt_progress import completion_progress_event
from radixserve.frontend.http.asgi_io import SSE_DONE
from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.openai.protocol import (CompletionLogprobs, CompletionRequest,
                                                 CompletionResponse, CompletionResponseChoice,
                                                 CompletionStreamResponse, PromptLogprob,
                                                 UsageInfo, random_id)
from radixserve.frontend.openai.response_size import (check_response_size, completion_terms,
                                                     off_loop_if_large)
from radixserve.frontend.openai.serving import TEXT_MARK, ChunkTemplate, ServingContext, merge, sse
from radixserve.frontend.truncation import (Truncation, keep_last, log_truncation, prompt_limit,
                                            truncated_details)
from radixserve.tokenizer.fim_prompt import fim_prompt_ids


_MAX_GATHERED = 8  # a request with more text prompts than this is encoded on its own


async def _prompts(ctx: ServingContext, body: CompletionRequest,
                   is_cut: bool) -> list[tuple[str | None, list[int]]]:
    prompt = body.prompt
    if isinstance(prompt, str):
        prompt = [prompt]
    elif prompt and isinstance(prompt[0], int):
        prompt = [prompt]
    if len(prompt) > ctx.max_prompts_per_request:  # counted before any is tokenized
        raise OpenAIError(f"prompt lists {len(prompt)} prompts; this server accepts at most "
                          f"{ctx.max_prompts_per_request} per request "
                          "(--max-prompts-per-request)", param="prompt")
    strings = [p for p in prompt if isinstance(p, str)]
    if not is_cut:  # before any tokenizing: a prompt too long by its length alone
        for text in strings:
            ctx.prep.check_length(len(text), "prompt")
    if body.suffix is not None:
        return await ctx.prep.run(_fim_prompts, ctx, strings, body.suffix)
    if len(strings) > _MAX_GATHERED:  # one batch on a worker thread, not a task per prompt
        encoded = await ctx.prep.encode_batch(strings)
    else:  # with the texts of concurrent requests, in one batch on the encoder's thread
        encoded = await asyncio.gather(*(ctx.encoder.encode(p) for p in strings))
    texts = iter(encoded)
    return [(p, next(texts)) if isinstance(p, str) else (None, list(p)) for p in prompt]


def _fim_prompts(ctx: ServingContext, prompts: list[str],
                 suffix: str) -> list[tuple[str | None, list[int]]]:
    """Each prompt filled in before ``suffix`` (`fim_prompt_ids`, the plain layout); 400
    naming ``suffix`` for a model without FIM tokens."""
    ctx.prep.check_length(len(suffix), "suffix")
    try:
        ctx.tokenizer.require_fim()
    except ValueError as exc:
        raise OpenAIError(f"suffix needs a fill-in-the-middle model: {exc}",
                          param="suffix") from None
    return [(p, fim_prompt_ids(ctx.tokenizer, p, suffix)) for p in prompts]


class CompletionServer:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def prepare(self, body: CompletionRequest):
        """(prompts, params, what truncation cut): validate and tokenize; OpenAIError /
        ValueError before anything is queued. With ``truncate_prompt_tokens`` each prompt
        keeps its last tokens (frontend/truncation.py)."""
        self.ctx.check_model(body.model)
        limit = prompt_limit(body.truncate_prompt_tokens, self.ctx.max_model_len,
                             body.requested_max_tokens())
        if limit is not None and body.suffix is not None:
            raise OpenAIError("truncate_prompt_tokens cannot cut a fill-in-the-middle prompt "
                              "(suffix)", param="truncate_prompt_tokens")
        prompts = await _prompts(self.ctx, body, limit is not None)
        prompts, cut = _cut(self.ctx, prompts, limit)
        for _, ids in prompts:
            if ids and (min(ids) < 0 or max(ids) >= self.ctx.tokenizer.vocab_size):
                raise OpenAIError("prompt token ids are out of the vocabulary", param="prompt")
        params = []
        for i, (_, ids) in enumerate(prompts):
            params.append(self.ctx.sampling_params(body, len(ids), "prompt"))
            if i % 64 == 63:
                await asyncio.sleep(0)  # a long prompt list must not hold the loop
        log_truncation("completion", cut, sum(len(ids) for _, ids in prompts))
        return prompts, params, cut

    def _streams(self, body, prompts, params, request_id, arrival, ticket):
        """Every sample's deltas, ``index`` being its choice index (prompt-major)."""
        n = params[0].n
        streams = [self.ctx.engine.generate(ids, p, f"{request_id}-{i}", body.priority, arrival,
                                               ticket)
                   for i, ((_, ids), p) in enumerate(zip(prompts, params))]
        if len(streams) == 1:
            return streams[0]
        return merge([_offset(stream, i * n) for i, stream in enumerate(streams)])

    def response_bytes(self, body: CompletionRequest, prompts, params,
                       limit: int | None = None, stream: bool = False) -> int:
        """The answer's estimated bytes (`response_size`); 400 naming the parameters and
        their product beyond ``limit``."""
        num_max_tokens = sum(p.max_tokens for p in params)
        return check_response_size(completion_terms(
            params[0].n, sum(len(ids) for _, ids in prompts), num_max_tokens, bool(body.echo),
            body.logprobs, body.prompt_logprobs, stream), limit)

    async def full(self, body: CompletionRequest, prompts, params, arrival: float,
                   ticket: QueueTicket = NO_TICKET,
                   cut: Truncation | None = None) -> CompletionResponse:
        request_id = random_id("cmpl-")
        finals: dict[int, tuple[RequestState, int]] = {}
        async with contextlib.aclosing(
            self._streams(body, prompts, params, request_id, arrival, ticket)
        ) as steps:
            async for step in steps:
                if step.state.finished:
                    finals[step.index] = (step.state, step.index // params[0].n)
        build = functools.partial(self._response, body, prompts, params, request_id, finals,
                                  cut)
        return await off_loop_if_large(self.response_bytes(body, prompts, params), build)

    def _response(self, body: CompletionRequest, prompts, params, request_id: str,
                  finals: dict[int, tuple[RequestState, int]],
                  cut: Truncation | None) -> CompletionResponse:
        """The whole answer from the finished samples (may run on a worker thread: it only
        reads them)."""
        choices = []
        for index in sorted(finals):
            state, prompt_idx = finals[index]
            text, logprobs = state.text, None
            echo = _echo_text(self.ctx, prompts[prompt_idx]) if body.echo else ""
            if state.logprobs is not None:
                logprobs = _logprobs(state, 0, len(state.token_ids), len(echo))
                if body.echo:
                    logprobs = _with_prompt(state, logprobs)
            choices.append(CompletionResponseChoice(
                index=index, text=echo + text, finish_reason=state.finish_reason,
                stop_reason=state.stop_reason, logprobs=logprobs,
                prompt_logprobs=_prompt_logprobs(body, state)))
        usage = _usage(prompts, params, [s for s, _ in finals.values()], cut)
        return CompletionResponse(id=request_id, model=self.ctx.model_name, choices=choices,
                                  usage=usage)

    async def stream(self, body: CompletionRequest, prompts, params, arrival: float,
                     ticket: QueueTicket = NO_TICKET,
                     cut: Truncation | None = None) -> AsyncIterator[str]:
        request_id = random_id("cmpl-")
        created = int(time.time())
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        states: dict[int, RequestState] = {}
        sent_echo: set[int] = set()
        text_offsets: dict[int, int] = {}  # per choice: text offset of its next token
        templates: dict[int, ChunkTemplate] = {}  # per choice: its plain text chunk
        unfinished = len(prompts) * params[0].n
        tail = ""  # the last choice's finish chunk, sent with the end of the stream
        async with contextlib.aclosing(
            self._streams(body, prompts, params, request_id, arrival, ticket)
        ) as steps:
            async for step in steps:
                index, state = step.index, step.state
                if step.progress is not None:
                    yield completion_progress_event(request_id, created, self.ctx.model_name,
                                                    index, step.progress)
                    continue
                states[index] = state
                text, first = step.text, index not in sent_echo
                sent_echo.add(index)
                if body.echo and first:
                    echo = _echo_text(self.ctx, prompts[index // params[0].n])
                    text = echo + text
                    text_offsets[index] = len(echo)
                if not text and not state.finished and not first:
                    continue
                if state.logprobs is None and not state.finished and not (
                        first and body.prompt_logprobs is not None):
                    template = templates.get(index)
                    if template is None:
                        template = templates[index] = ChunkTemplate(CompletionStreamResponse(
                            id=request_id, created=created, model=self.ctx.model_name,
                            choices=[CompletionResponseChoice(index=index, text=TEXT_MARK)]))
                    yield template.sse(text)
                    continue
                logprobs = None
                if state.logprobs is not None:
                    new = len(step.output.new_token_ids)
                    start = len(state.token_ids) - new
                    logprobs = _logprobs(state, start, len(state.token_ids),
                                         text_offsets.get(index, 0))
                    text_offsets[index] = text_offsets.get(index, 0) + sum(
                        len(t) for t in logprobs.tokens)
                    if body.echo and first:
                        logprobs = _with_prompt(state, logprobs)
                choice = CompletionResponseChoice(
                    index=index, text=text, logprobs=logprobs,
                    finish_reason=state.finish_reason if state.finished else None,
                    stop_reason=state.stop_reason if state.finished else None,
                    prompt_logprobs=_prompt_logprobs(body, state) if first else None)
                event = sse(CompletionStreamResponse(
                    id=request_id, created=created, model=self.ctx.model_name, choices=[choice]))
                unfinished -= state.finished
                if unfinished:
                    yield event
                else:
                    tail = event
        if include_usage:
            usage = _usage(prompts, params, list(states.values()), cut)
            tail += sse(CompletionStreamResponse(id=request_id, created=created,
                                                 model=self.ctx.model_name, choices=[],
                                                 usage=usage))
        yield tail + SSE_DONE  # one write ends the response


async def _offset(steps: AsyncIterator[StepDelta], base: int):
    """``steps`` with their sample index shifted by ``base`` (the prompt's first choice)."""
    async with contextlib.aclosing(steps) as deltas:
        async for step in deltas:
            step.index += base
            yield step


def request_size(ctx: ServingContext, body: CompletionRequest) -> tuple[int, int]:
    """(sequences, the fewest prompt tokens they can have) of a request, before tokenizing:
    what admission control checks first. 400 if a prompt is too long by its length alone."""
    prompt = body.prompt
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompt = [prompt]
    is_cut = body.truncate_prompt_tokens is not None  # cut, not refused: frontend/truncation
    for p in prompt:
        if isinstance(p, str) and not is_cut:
            ctx.prep.check_length(len(p), "prompt")
    min_tokens = sum(ctx.prep.min_tokens(len(p)) if isinstance(p, str) else len(p)
                     for p in prompt)
    if is_cut:
        min_tokens = min(min_tokens, len(prompt) * ctx.max_model_len)
    n = body.n or 1
    return len(prompt) * n, min_tokens  # n samples share their prompt's prefill


def _echo_text(ctx: ServingContext, prompt: tuple[str | None, list[int]]) -> str:
    text, ids = prompt
    return text if text is not None else ctx.tokenizer.decode(ids, skip_special_tokens=False)


def _usage(prompts, params, states: list[RequestState], cut: Truncation | None) -> UsageInfo:
    num_prompt = sum(len(ids) for _, ids in prompts)
    num_completion = sum(len(s.token_ids) for s in states)
    cached = sum(s.num_cached_tokens for s in states if s.index == 0)
    return UsageInfo(prompt_tokens=num_prompt, completion_tokens=num_completion,
                     total_tokens=num_prompt + num_completion,
                     prompt_tokens_details=truncated_details(cached, cut))


def _cut(ctx: ServingContext, prompts: list[tuple[str | None, list[int]]], limit: int | None
         ) -> tuple[list[tuple[str | None, list[int]]], Truncation | None]:
    """Each prompt cut to its last ``limit`` tokens (None: as they are), a cut one losing
    its text (an echo then shows the tokens kept); and what was cut, in all."""
    if limit is None:
        return prompts, None
    out, cuts = [], []
    for text, ids in prompts:
        kept, cut = keep_last(ids, limit, ctx.tokenizer.bos_prefix)
        out.append((text if cut is None else None, kept))
        cuts.append(cut)
    return out, Truncation.total(cuts)


def _with_prompt(state: RequestState, logprobs: CompletionLogprobs) -> CompletionLogprobs:
    """``logprobs`` of the generated tokens led by the prompt's (echo): each prompt token's
    text, logprob (None for the first) and top alternatives, at its offset in the echo."""
    tokens, token_lps, tops, offsets = [], [], [], []
    offset = 0
    decode = state.tokenizer.decode
    for token_id, entry in zip(state.prompt_token_ids, state.prompt_logprobs):
        text = decode([token_id], skip_special_tokens=False) if entry is None else entry[
            token_id].decoded_token
        tokens.append(text)
        token_lps.append(None if entry is None else entry[token_id].logprob)
        tops.append(None if entry is None else {lp.decoded_token: lp.logprob
                                                for lp in entry.values() if lp.rank is not None})
        offsets.append(offset)
        offset += len(text)
    return CompletionLogprobs(tokens=tokens + logprobs.tokens,
                              token_logprobs=token_lps + logprobs.token_logprobs,
                              top_logprobs=tops + logprobs.top_logprobs,
                              text_offset=offsets + logprobs.text_offset)


def _prompt_logprobs(body: CompletionRequest, state: RequestState
                     ) -> list[dict[str, PromptLogprob] | None] | None:
    """vLLM's ``prompt_logprobs`` of a choice, when the request asked for them."""
    if body.prompt_logprobs is None or state.prompt_logprobs is None:
        return None
    return [None if entry is None else {
        str(tid): PromptLogprob(logprob=lp.logprob, rank=lp.rank, decoded_token=lp.decoded_token)
        for tid, lp in entry.items()} for entry in state.prompt_logprobs]


def _logprobs(state: RequestState, start: int, end: int,
              offset: int = 0) -> CompletionLogprobs:
    """OpenAI completions logprobs for tokens ``start:end`` of ``state``; ``offset`` is the
    text offset of token ``start`` (the caller carries it across stream chunks)."""
    tokens, token_lps, tops, offsets = [], [], [], []
    for token_id, entry in zip(state.token_ids[start:end], state.logprobs[start:end]):
        text = entry[token_id].decoded_token
        tokens.append(text)
        token_lps.append(entry[token_id].logprob)
        tops.append({lp.decoded_token: lp.logprob for lp in entry.values()
                     if lp.rank is not None})
        offsets.append(offset)
        offset += len(text)
    return CompletionLogprobs(tokens=tokens, token_logprobs=token_lps, top_logprobs=tops,
                              text_offset=offsets)
