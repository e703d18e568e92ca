"""One request's ``n`` samples as engine requests, and their outputs back as text.

Shared by the offline ``LLM`` (engine in-process) and the API process's ``AsyncLLM`` (engine in
its own process): `gate_on_reasoning` prepares the constraint every sample shares, `Fanout`
names the samples' engine requests, turns each sample's outputs into text (its `RequestState`)
and says when a stop string ended a sample the engine does not know is done. The callers own
only the transport: submitting, stepping or waiting, aborting.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from radixserve.frontend.output_processor import RequestState
from radixserve.frontend.parsers.reasoning import ReasoningParser
from radixserve.core.reports import EngineCoreOutput
from radixserve.messages import EngineCoreRequest, ImageInput
from radixserve.outputs import RequestOutput
from radixserve.sampling_params import SamplingParams
from radixserve.tokenizer.tokenizer import Tokenizer


def gate_on_reasoning(params: SamplingParams, parser: ReasoningParser | None, prompt: str,
                      tokenizer: Tokenizer) -> SamplingParams:
    """``params`` with its structured-output constraint starting after the reasoning ends.

    The end is the reasoning parser's own ``end_tag``, as token ids (no special tokens added).
    ``params`` comes back unchanged (the same object) when it has no constraint; when there is
    no reasoning parser (the server without ``--reasoning-parser``, ``LLM`` without
    ``reasoning_parser``: the output is not taken to think first, whatever
    ``after_reasoning`` says); when the request turned it off (``after_reasoning`` false); when
    the caller set ``reasoning_end_token_ids`` itself; or when ``prompt`` already closed the
    block (e.g. Qwen3 with thinking off: the template wrote an empty one). Otherwise a copy:
    the caller's params are never mutated (offline callers reuse them across prompts).
    """
    constraint = params.structured_outputs
    if (constraint is None or parser is None or constraint.after_reasoning is False
            or constraint.reasoning_end_token_ids):
        return params
    if prompt.rfind(parser.end_tag) > prompt.rfind(parser.start_tag):
        return params
    end = tokenizer.encode(parser.end_tag, add_special_tokens=False)
    return params.clone(structured_outputs=msgspec.structs.replace(
        constraint, reasoning_end_token_ids=end))


class Fanout:
    """The ``n`` samples of one request: one engine request each, sharing the prompt, with the
    seed `SamplingParams.for_sample` derives, and one `RequestState` each (``states``, keyed by
    engine request id, in sample order). Sample i's id is ``f"{request_id}-{i}"``, or the
    request's own id when n is 1.

    ``unfinished`` holds the engine request ids the caller must abort if it stops early.
    NOTE: `requests` counts a sample there as it yields its request, before the caller
    submits it, so a submission that raises half-way is aborted too.
    """

    __slots__ = ("request_id", "prompt_token_ids", "images", "params", "tokenizer", "states",
                 "unfinished")

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 tokenizer: Tokenizer, images: list[ImageInput] | tuple = ()) -> None:
        """``images``: the prompt's (radixserve/multimodal/), sent with every sample."""
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.images = list(images)
        self.params = params
        self.tokenizer = tokenizer
        self.states: dict[str, RequestState] = {}
        self.unfinished: set[str] = set()

    def requests(self, eos_token_ids: list[int], priority: int = 0,
                 arrival_time: float = 0.0) -> Iterator[EngineCoreRequest]:
        """The samples' engine requests, in sample order, for the caller to submit."""
        n = self.params.n
        for i in range(n):
            child = self.params.for_sample(i)
            rid = f"{self.request_id}-{i}" if n > 1 else self.request_id
            self.states[rid] = RequestState(i, self.prompt_token_ids, child, self.tokenizer)
            self.unfinished.add(rid)
            yield EngineCoreRequest(request_id=rid, prompt_token_ids=self.prompt_token_ids,
                                    sampling_params=child, eos_token_ids=eos_token_ids,
                                    arrival_time=arrival_time, priority=priority,
                                    images=self.images)

    def apply(self, rid: str, outs: list[EngineCoreOutput]
              ) -> tuple[RequestState, str, EngineCoreOutput, bool] | None:
        """Apply consecutive outputs of sample ``rid``; return (its state, the text they
        release, the outputs applied merged into one, whether to abort it in the engine).

        None when the sample had finished already: outputs the engine sent before it saw our
        abort. Abort is true when a stop string ended the sample here (the engine would go
        on). A sample that finishes leaves ``unfinished``; one whose output raised stays.
        """
        state = self.states[rid]
        if state.finished:
            return None
        text, applied = _process(state, outs)
        if not state.finished:
            return state, text, applied, False
        self.unfinished.discard(rid)
        return state, text, applied, applied.finish_reason is None

    def request_output(self, prompt: str | None) -> RequestOutput:
        """The finished request: every sample's output in index order; the cached prompt
        tokens as the last sample saw them."""
        result = RequestOutput(self.request_id, prompt, self.prompt_token_ids)
        for state in self.states.values():
            result.outputs.append(state.completion_output())
            result.num_cached_tokens = state.num_cached_tokens
            if state.prompt_logprobs is not None:
                result.prompt_logprobs = state.prompt_logprobs
        result.outputs.sort(key=lambda o: o.index)
        result.finished = True
        return result


def _process(state: RequestState, outs: list[EngineCoreOutput]) -> tuple[str, EngineCoreOutput]:
    """Apply consecutive outputs of one request; return the text they release and the
    outputs applied, merged into one.

    Without stop strings they are applied as one merged output (one detokenizer call per
    wake-up, not per token). With stop strings each is applied in turn, so that the output's
    token ids end at the step that completed the stop string, whatever was merged.
    """
    if not state.params.stop:
        merged = _merge(outs)
        return state.process(merged), merged
    text, applied = "", 0
    for out in outs:
        text += state.process(out)
        applied += 1
        if state.finished:
            break
    return text, _merge(outs[:applied])


def _merge(outs: list[EngineCoreOutput]) -> EngineCoreOutput:
    """Consecutive outputs of one request as one."""
    if len(outs) == 1:
        return outs[0]
    last = outs[-1]
    with_logprobs = outs[0].logprobs is not None
    return EngineCoreOutput(
        last.request_id, [t for o in outs for t in o.new_token_ids], last.finish_reason,
        [lp for o in outs for lp in o.logprobs or []] if with_logprobs else None,
        [top for o in outs for top in o.top_logprobs or []] if with_logprobs else None,
        last.num_cached_tokens, outs[0].queue_time, None,
        prompt_logprobs=outs[0].prompt_logprobs,
        prompt_top_logprobs=outs[0].prompt_top_logprobs)
