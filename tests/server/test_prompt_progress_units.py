"""`AsyncLLM.generate` with prompt progress (``return_progress``), against a fake engine client:
progress deltas come before the sample's tokens, only when they advance, the latest of those
that arrived together; they do not count as the sample's start."""

from __future__ import annotations

import asyncio

from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import WordLevel

from radixserve.core.reports import EngineCoreOutput, PromptProgress
from radixserve.frontend.async_llm import AsyncLLM, QueueTicket
from radixserve.sampling_params import SamplingParams
from radixserve.tokenizer.tokenizer import Tokenizer


class _Client:
    def __init__(self) -> None:
        self.buffers = {}

    async def add_request(self, request, buffer) -> int:
        self.buffers[request.request_id] = buffer
        return 0

    async def abort(self, request_ids) -> None: ...


class _Ticket(QueueTicket):
    __slots__ = ("starts",)

    def __init__(self) -> None:
        self.starts = 0

    def started(self, num_prompt_tokens: int) -> None:
        self.starts += 1


def _progress(rid: str, processed: int, cache: int = 0) -> EngineCoreOutput:
    return EngineCoreOutput(rid, [], prompt_progress=PromptProgress(40, cache, processed, 5))


def _engine() -> tuple[AsyncLLM, _Client]:
    backend = HFTokenizer(WordLevel({"<s>": 0, "</s>": 1, "a": 2, "b": 3}, unk_token="a"))
    client = _Client()
    return AsyncLLM(client, Tokenizer(backend, bos_token_id=0, eos_token_id=1), 64), client


def _run(params: SamplingParams, batches: list[list[EngineCoreOutput]]):
    """(each delta as (index, progress processed or None, new token ids), ticket starts)."""
    engine, client = _engine()
    ticket = _Ticket()

    async def main():
        seen = []
        gen = engine.generate([2, 3] * 20, params, "r", ticket=ticket)
        task = asyncio.ensure_future(_collect(gen, seen))
        await asyncio.sleep(0)
        for batch in batches:
            for out in batch:
                client.buffers[out.request_id].put(out)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        await task
        return seen

    async def _collect(gen, seen):
        async for d in gen:
            seen.append((d.index, d.progress and d.progress.processed,
                         list(d.output.new_token_ids)))
            if d.progress is not None:
                assert d.text == "" and not d.state.finished

    return asyncio.run(main()), ticket.starts


def test_progress_comes_first_and_only_when_it_advances():
    params = SamplingParams(max_tokens=1, return_progress=True)
    seen, starts = _run(params, [
        [_progress("r", 16)],
        [_progress("r", 24), _progress("r", 32)],  # arrived together: the latest
        [_progress("r", 8)],  # a preemption restarted the prefill: not sent
        [_progress("r", 40), EngineCoreOutput("r", [3], "length")]])
    assert seen == [(0, 16, []), (0, 32, []), (0, 40, []), (0, None, [3])]
    assert starts == 1  # the first token started the sample, not a progress report


def test_each_sample_reports_its_own_progress():
    params = SamplingParams(max_tokens=1, n=2, return_progress=True)
    seen, _ = _run(params, [
        [_progress("r-0", 40, cache=32), _progress("r-1", 40, cache=32)],
        [EngineCoreOutput("r-0", [2], "length"), EngineCoreOutput("r-1", [3], "length")]])
    assert seen == [(0, 40, []), (1, 40, []), (0, None, [2]), (1, None, [3])]
