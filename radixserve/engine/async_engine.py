"""AsyncLLM: the API process's engine: requests in, per-step text deltas out.

Owns what is text: the prompt's token ids come in, each of the ``n`` samples becomes one
engine request (sharing the prompt), and every engine step's output is turned into a text delta
by that sample's ``RequestState`` (detokenizer, stop strings, logprobs). A consumer that stops
iterating (client gone) aborts whatever is unfinished.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from radixserve.engine.core_client import EngineCoreClient, EngineDeadError
from radixserve.engine.messages import EngineCoreOutput, EngineCoreRequest
from radixserve.engine.output_processor import RequestState
from radixserve.engine.tokenizer import Tokenizer
from radixserve.sampling_params import SamplingParams


class EngineRequestError(ValueError):
    """The engine refused a request (message from the engine)."""


@dataclass(slots=True)
class StepDelta:
    """One sample's progress in one engine step."""

    index: int
    text: str
    state: RequestState
    output: EngineCoreOutput


class MetricsSink:
    """Null metrics: the server passes a Prometheus-backed subclass."""

    def on_first_token(self, ttft: float, queue_time: float | None) -> None: ...
    def on_token(self, itl: float) -> None: ...
    def on_finish(self, state: RequestState, num_prompt: int, e2e: float) -> None: ...


class AsyncLLM:
    def __init__(self, client: EngineCoreClient, tokenizer: Tokenizer, max_model_len: int,
                 metrics: MetricsSink | None = None) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.metrics = metrics or MetricsSink()
        self.eos_token_ids = sorted(tokenizer.eos_token_ids)

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams,
                       request_id: str, priority: int = 0,
                       arrival_time: float | None = None) -> AsyncIterator[StepDelta]:
        """Yield each sample's text deltas as engine steps arrive, until all samples finish.

        Raises EngineRequestError if the engine refused the request, EngineDeadError if the
        engine died.
        """
        arrival = arrival_time or time.time()
        queue: asyncio.Queue = asyncio.Queue()
        states: dict[str, RequestState] = {}
        for i in range(params.n):
            child = params.for_sample(i)
            rid = f"{request_id}-{i}" if params.n > 1 else request_id
            states[rid] = RequestState(i, prompt_token_ids, child, self.tokenizer)
            req = EngineCoreRequest(request_id=rid, prompt_token_ids=prompt_token_ids,
                                    sampling_params=child, eos_token_ids=self.eos_token_ids,
                                    arrival_time=arrival, priority=priority)
            await self.client.add_request(req, queue)
        unfinished = set(states)
        last_token_time = None
        try:
            while unfinished:
                out = await queue.get()
                if isinstance(out, EngineDeadError):
                    raise out
                if out.error is not None:
                    raise EngineRequestError(out.error)
                state = states[out.request_id]
                delta = state.process(out)
                now = time.time()
                if last_token_time is None:
                    self.metrics.on_first_token(now - arrival, out.queue_time)
                else:
                    self.metrics.on_token(now - last_token_time)
                last_token_time = now
                if state.finished:
                    unfinished.discard(out.request_id)
                    if out.finish_reason is None:  # a stop string ended it here
                        await self.client.abort([out.request_id])
                    self.metrics.on_finish(state, len(prompt_token_ids), now - arrival)
                yield StepDelta(state.index, delta, state, out)
        finally:
            if unfinished:
                await self.client.abort(list(unfinished))
