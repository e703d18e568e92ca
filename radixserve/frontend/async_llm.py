"""AsyncLLM: the API process's engine: requests in, per-step text deltas out.

Owns what is text: the prompt's token ids come in, each of the ``n`` samples becomes one
engine request (sharing the prompt), and every engine step's output is turned into a text delta
by that sample's ``RequestState`` (detokenizer, stop strings, logprobs) — all of it in
`Fanout`, which the offline ``LLM`` shares; this class adds the transport (the engine-core
client, waiting, deadlines, metrics). A consumer that stops iterating (client gone) aborts
whatever is unfinished.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from radixserve.frontend.core_client import EngineCoreClient, EngineDeadError
from radixserve.core.reports import EngineCoreOutput, PromptProgress
from radixserve.frontend.fanout import Fanout
from radixserve.messages import EngineCoreRequest
from radixserve.frontend.output_buffer import OutputBuffer
from radixserve.frontend.output_processor import RequestState
from radixserve.tokenizer.tokenizer import Tokenizer
from radixserve.pooling_params import PoolingParams
from radixserve.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_NO_SAMPLING = SamplingParams(max_tokens=1)  # what an embedding request carries (never read)


class EngineRequestError(ValueError):
    """The engine refused a request (message from the engine)."""


class EngineStepError(RuntimeError):
    """A fault while running the request ended it: in the engine's step (the forward, the
    sampler, its grammar) or in turning its tokens into text here. A server error (500); the
    engine and the other requests go on."""


@dataclass(slots=True)
class StepDelta:
    """One sample's progress since the previous delta (one engine step, or several merged
    when the consumer fell behind; ``output`` then holds all their tokens).

    ``progress`` is set only when the params asked for prompt progress (``return_progress``),
    on a delta of its own (no text, ``output`` the engine's progress record) sent while the
    sample's prompt prefills, before its first tokens: the latest of what arrived, and only
    when it got further than the previous one.
    """

    index: int
    text: str
    state: RequestState
    output: EngineCoreOutput
    progress: PromptProgress | None = None


class QueueTicket:
    """Null ticket: no queue deadline, nothing counted. The server's admission gate hands out
    a subclass per request (`radixserve.frontend.http.admission.Ticket`)."""

    __slots__ = ()
    deadline: float | None = None  # time.monotonic() by which every sample must have started

    def started(self, num_prompt_tokens: int) -> None:
        """One sample got its first output (its prompt is prefilled)."""

    def timed_out(self, waited: float) -> Exception:
        """The error to raise when ``deadline`` passed with a sample not started."""
        return EngineRequestError(f"the request did not start within {waited:.1f} s")


NO_TICKET = QueueTicket()


@dataclass(slots=True)
class FinishedSample:
    """One sample (one engine request) at its end, for the metrics. Times are seconds since
    the HTTP request arrived, taken in this process as outputs arrive; ``queue_time`` is the
    engine's (arrival to first scheduling; None if it never scheduled the request). The phases
    as vLLM draws them:

        arrival ── queue ──> scheduled ── prefill ──> first output ── decode ──> finished
                             |<────────────────── inference ──────────────────>|
    """

    state: RequestState
    engine: int  # the data-parallel replica that ran it
    n: int  # samples the request asked for (the sample's own params say 1)
    num_prompt_tokens: int
    e2e: float
    first_output: float
    queue_time: float | None

    @property
    def num_generation_tokens(self) -> int:
        return len(self.state.token_ids)

    @property
    def prefill_time(self) -> float | None:
        return None if self.queue_time is None else max(0.0, self.first_output - self.queue_time)

    @property
    def decode_time(self) -> float:
        return self.e2e - self.first_output

    @property
    def inference_time(self) -> float | None:
        return None if self.queue_time is None else max(0.0, self.e2e - self.queue_time)

    @property
    def time_per_output_token(self) -> float:
        """Decode time per token after the first (0 with one token), as vLLM's
        ``request_time_per_output_token_seconds``."""
        n = self.num_generation_tokens
        return self.decode_time / (n - 1) if n > 1 else 0.0


class MetricsSink:
    """Null metrics: the server passes a Prometheus-backed subclass. ``engine`` is the
    data-parallel replica that produced what is observed (0 with one engine)."""

    def on_first_token(self, ttft: float, engine: int) -> None:
        """The request's first delivery (of any of its samples) since it arrived."""
    def on_token(self, itl: float, engine: int) -> None:
        """The gap since the previous delivery of this request's tokens (one per engine step,
        or several when the consumer fell behind and they were merged)."""
    def on_generated(self, num_tokens: int, engine: int) -> None:
        """Tokens the engine generated for a request, counted as they arrive (aborted
        requests' too)."""
    def on_finish(self, sample: FinishedSample) -> None: ...
    def on_abort(self, num_requests: int) -> None:
        """Engine requests aborted unfinished (the consumer stopped: client gone, timeout,
        error)."""


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
                       arrival_time: float | None = None,
                       ticket: QueueTicket = NO_TICKET,
                       images: list | tuple = ()) -> AsyncIterator[StepDelta]:
        """Yield each sample's text deltas as engine steps arrive, until all samples finish.
        ``images``: the prompt's (messages.ImageInput, prompt order).

        ``ticket.started`` is called as each sample gets its first output; a sample not started
        by ``ticket.deadline`` aborts the request and raises ``ticket.timed_out(...)``.
        Raises EngineRequestError if the engine refused the request, EngineStepError if a
        fault while running it ended it, EngineDeadError if the engine died.

        NOTE: however it ends (finished, refused, an exception here or in the consumer, the
        consumer closing it), every sample it registered with the client is unregistered:
        the ``finally`` aborts whatever is unfinished, including samples whose registration
        raised half-way.
        """
        arrival = arrival_time or time.time()
        buffer = OutputBuffer()
        fanout = Fanout(request_id, prompt_token_ids, params, self.tokenizer, images)
        not_started: set[str] = set()
        engines: dict[str, int] = {}  # sample's request id -> the replica running it
        started: dict[str, tuple[float, float | None]] = {}  # -> (first output, queue time)
        last_token_time = None
        reported: dict[str, int] = {}  # sample's request id -> prompt tokens reported done
        try:
            for req in fanout.requests(self.eos_token_ids, priority, arrival):
                not_started.add(req.request_id)
                engines[req.request_id] = await self.client.add_request(req, buffer)
            while fanout.unfinished:
                # NOTE: a consumer that falls behind gets every output waiting for it at once,
                # merged into one delta per sample: fewer wake-ups and chunks, the same text.
                if not_started and ticket.deadline is not None:
                    pending = await _take_before(buffer, ticket, arrival)
                else:
                    pending = await buffer.take()
                if params.return_progress:
                    for step in _progress_steps(pending, fanout, reported):
                        yield step
                    if not pending:
                        continue
                now = time.time()
                for rid, outs in _by_request(pending).items():
                    if rid in not_started:
                        not_started.discard(rid)
                        started[rid] = (now - arrival, outs[0].queue_time)
                        ticket.started(len(prompt_token_ids))
                    try:
                        step = fanout.apply(rid, outs)
                    except Exception as exc:  # noqa: BLE001 - this request's fault alone
                        logger.error("request %s: processing its output failed", rid,
                                     exc_info=exc)
                        raise EngineStepError(f"processing the request's output failed: "
                                              f"{type(exc).__name__}: {exc}") from exc
                    if step is None:
                        continue  # sent before our abort of a stop-string finish arrived
                    state, text, applied, abort = step
                    self.metrics.on_generated(len(applied.new_token_ids), engines[rid])
                    if state.finished:
                        if abort:
                            await self.client.abort([rid])
                        self.metrics.on_finish(FinishedSample(
                            state, engines[rid], params.n, len(prompt_token_ids), now - arrival,
                            *started[rid]))
                    yield StepDelta(state.index, text, state, applied)
                # one latency observation per wake-up, however many steps it delivered
                engine = engines[pending[0].request_id]
                if last_token_time is None:
                    self.metrics.on_first_token(now - arrival, engine)
                else:
                    self.metrics.on_token(now - last_token_time, engine)
                last_token_time = now
        finally:
            if fanout.unfinished:
                self.metrics.on_abort(len(fanout.unfinished))
                await self.client.abort(list(fanout.unfinished))

    async def embed(self, prompt_token_ids: list[int], pooling: PoolingParams,
                    request_id: str, priority: int = 0, arrival_time: float | None = None,
                    ticket: QueueTicket = NO_TICKET) -> EngineCoreOutput:
        """Prefill ``prompt_token_ids`` as an embedding request; its one output, whose
        ``pooled`` holds the raw pooled vector. Raises as `generate` does; a consumer that is
        cancelled meanwhile aborts the request."""
        arrival = arrival_time or time.time()
        buffer = OutputBuffer()
        req = EngineCoreRequest(request_id=request_id, prompt_token_ids=prompt_token_ids,
                                sampling_params=_NO_SAMPLING, arrival_time=arrival,
                                priority=priority, pooling_params=pooling)
        await self.client.add_request(req, buffer)
        finished = False
        try:
            while True:
                pending = (await _take_before(buffer, ticket, arrival)
                           if ticket.deadline is not None else await buffer.take())
                for out in _by_request(pending).get(request_id, ()):
                    if out.finish_reason is not None:
                        finished = True
                        ticket.started(len(prompt_token_ids))
                        return out
        finally:
            if not finished:
                await self.client.abort([request_id])


async def _take_before(buffer: OutputBuffer, ticket: QueueTicket, arrival: float) -> list:
    """``buffer.take()``, raising ``ticket.timed_out`` once its deadline has passed."""
    try:
        async with asyncio.timeout(max(0.0, ticket.deadline - time.monotonic())):
            return await buffer.take()
    except TimeoutError:
        raise ticket.timed_out(time.time() - arrival) from None


def _progress_steps(pending: list, fanout: Fanout, reported: dict[str, int]) -> list[StepDelta]:
    """Take the prompt-progress records out of ``pending`` (in place); a delta for each
    sample's latest one that got further than what ``reported`` holds (updated)."""
    latest: dict[str, EngineCoreOutput] = {}
    kept = []
    for out in pending:
        if isinstance(out, EngineCoreOutput) and out.prompt_progress is not None:
            latest[out.request_id] = out
        else:
            kept.append(out)
    if not latest:
        return []
    pending[:] = kept
    steps = []
    for rid, out in latest.items():
        state = fanout.states.get(rid)
        processed = out.prompt_progress.processed
        if state is None or state.finished or processed <= reported.get(rid, -1):
            continue
        reported[rid] = processed
        steps.append(StepDelta(state.index, "", state, out, out.prompt_progress))
    return steps


def _by_request(pending: list) -> dict[str, list[EngineCoreOutput]]:
    """The outputs taken from the buffer, grouped per request in arrival order; raises what
    the engine reported instead of an output."""
    grouped: dict[str, list[EngineCoreOutput]] = {}
    for out in pending:
        if isinstance(out, EngineDeadError):
            raise out
        if out.error is not None:
            if out.finish_reason == "error":
                raise EngineStepError(out.error)
            raise EngineRequestError(out.error)
        outs = grouped.get(out.request_id)
        if outs is None:
            grouped[out.request_id] = [out]
        else:
            outs.append(out)
    return grouped

