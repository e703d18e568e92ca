"""The output path the offline LLM and the server's AsyncLLM share (`radixserve.frontend.fanout`):
the samples' engine requests, outputs back to text, the stop-string abort (no model: fed
EngineCoreOutput records), and the reasoning gate both sides put on structured outputs."""

from __future__ import annotations

import asyncio

import pytest
from tiny_models import make_hf_model

from radixserve import LLM
from radixserve.frontend.async_llm import AsyncLLM
from radixserve.frontend.fanout import Fanout, gate_on_reasoning
from radixserve.frontend.openai.protocol_chat import ChatCompletionRequest
from radixserve.frontend.openai.serving import ServingContext
from radixserve.frontend.openai.serving_chat import ChatServer
from radixserve.frontend.parsers import REASONING_PARSERS, ReasoningParser, get_reasoning_parser
from radixserve.core.reports import EngineCoreOutput as Out
from radixserve.sampling_params import SamplingParams
from radixserve.structured.params import StructuredOutputsParams as SO


class _Detok:
    def __init__(self) -> None:
        self.num_steps = 0

    def step(self, ids: list[int]) -> str:
        self.num_steps += 1
        return "".join(chr(i) for i in ids)

    def flush(self) -> str:
        return ""


class _Tokenizer:
    """Token id i is the character chr(i)."""

    def detokenizer(self, prompt_token_ids, skip_special_tokens=True):
        return _Detok()

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)

    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]


def _ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_samples_are_named_seeded_and_counted_as_they_are_handed_out():
    fanout = Fanout("req", [1, 2], SamplingParams(n=3, seed=7), _Tokenizer())
    requests = fanout.requests([0], priority=2, arrival_time=5.0)
    first = next(requests)
    assert fanout.unfinished == {"req-0"}  # before the caller submitted it
    reqs = [first, *requests]
    assert [r.request_id for r in reqs] == ["req-0", "req-1", "req-2"]
    assert [r.sampling_params for r in reqs] == [SamplingParams(n=3, seed=7).for_sample(i)
                                                 for i in range(3)]
    assert len({r.sampling_params.seed for r in reqs}) == 3
    assert all(r.prompt_token_ids == [1, 2] and r.eos_token_ids == [0] and r.priority == 2
               and r.arrival_time == 5.0 for r in reqs)
    assert [s.index for s in fanout.states.values()] == [0, 1, 2]
    single = Fanout("one", [1], SamplingParams(seed=7), _Tokenizer())
    (req,) = single.requests([0])
    assert req.request_id == "one" and req.sampling_params.seed == 7


def test_outputs_merge_into_one_delta_and_the_engine_finish_needs_no_abort():
    fanout = Fanout("r", [1], SamplingParams(n=2, logprobs=0), _Tokenizer())
    list(fanout.requests([0]))
    outs = [Out("r-1", _ids("ab"), None, [-1.0, -2.0], [[], []], 3, 0.5),
            Out("r-1", _ids("c"), "length", [-3.0], [[]], 4)]
    state, text, applied, abort = fanout.apply("r-1", outs)
    assert (text, abort, state.index, state.finish_reason) == ("abc", False, 1, "length")
    assert state.detok.num_steps == 1  # one detokenizer call for the whole wake-up
    assert applied == Out("r-1", _ids("abc"), "length", [-1.0, -2.0, -3.0], [[], [], []], 4,
                          0.5)
    assert fanout.unfinished == {"r-0"}
    fanout.apply("r-0", [Out("r-0", _ids("x"), "stop", [-0.5], [[]], 2)])
    assert not fanout.unfinished
    result = fanout.request_output("p")
    assert [o.index for o in result.outputs] == [0, 1] and result.finished
    assert [o.text for o in result.outputs] == ["x", "abc"]
    assert result.num_cached_tokens == 4  # as the last sample saw it


def test_a_stop_string_ends_the_sample_and_asks_for_its_abort():
    fanout = Fanout("r", [1], SamplingParams(stop=["STOP"]), _Tokenizer())
    list(fanout.requests([0]))
    outs = [Out("r", _ids("aS")), Out("r", _ids("TO")), Out("r", _ids("Pb")),
            Out("r", _ids("cd"))]
    state, text, applied, abort = fanout.apply("r", outs[:1])
    assert (text, abort) == ("", False)  # "aS" might still become "STOP": held back
    state, text, applied, abort = fanout.apply("r", outs[1:])
    assert (text, abort, state.finish_reason, state.stop_reason) == ("a", True, "stop", "STOP")
    assert applied.new_token_ids == _ids("TOPb")  # up to the step that completed "STOP"
    assert state.text == "a" and not fanout.unfinished
    # the engine's outputs sent before it saw the abort are dropped
    assert fanout.apply("r", [Out("r", _ids("e"), "length")]) is None


def test_an_output_that_raises_leaves_its_sample_to_abort():
    fanout = Fanout("r", [1], SamplingParams(n=2), _Tokenizer())
    list(fanout.requests([0]))
    with pytest.raises(TypeError):
        fanout.apply("r-0", [Out("r-0", [None])])
    assert fanout.unfinished == {"r-0", "r-1"}


REASON = ReasoningParser(start_tag="<reason>", end_tag="</reason>")


@pytest.mark.parametrize("after_reasoning, prompt, parser, gated", [
    (None, "u: hi\na: <reason>", REASON, True),
    (True, "u: hi\na:", REASON, True),
    (False, "u: hi\na: <reason>", REASON, False),  # the request turned it off
    (None, "u: hi\na: <reason></reason>", REASON, False),  # the template closed the block
    (True, "u: hi\na: <reason>", None, False),  # no reasoning parser: as the server without one
])
def test_the_gate_starts_structured_outputs_after_the_parsers_end_tag(
        after_reasoning, prompt, parser, gated):
    params = SamplingParams(structured_outputs=SO(regex="[0-9]", after_reasoning=after_reasoning))
    gate = gate_on_reasoning(params, parser, prompt, _Tokenizer())
    assert gate.structured_outputs.reasoning_end_token_ids == (_ids("</reason>") if gated else [])
    assert params.structured_outputs.reasoning_end_token_ids == []  # never mutated
    assert gate_on_reasoning(SamplingParams(), REASON, prompt, _Tokenizer()) == SamplingParams()


class _Client:
    async def add_request(self, request, buffer) -> None: ...
    async def abort(self, request_ids) -> None: ...


@pytest.fixture
def reason_parser(monkeypatch):
    """A registered reasoning parser whose tags are not <think>'s."""
    monkeypatch.setitem(REASONING_PARSERS, "reason",
                        {"start_tag": REASON.start_tag, "end_tag": REASON.end_tag})
    return "reason"


def test_offline_and_server_gate_on_the_same_end_tag(tmp_path, reason_parser):
    path = make_hf_model("llama", tmp_path / "m", seed=3)
    messages = [{"role": "user", "content": "hi"}]
    sent = []

    def sent_end_ids(reasoning_parser, after_reasoning) -> tuple[list[int], LLM]:
        llm = LLM(str(path), num_kv_blocks=32, block_size=4, show_progress=False,
                  reasoning_parser=reasoning_parser)
        add_request = llm.engine.add_request
        llm.engine.add_request = lambda req: (sent.append(req), add_request(req))[1]
        params = SamplingParams(max_tokens=2, structured_outputs=SO(
            regex="[0-9]+", after_reasoning=after_reasoning))
        llm.chat(messages, params)
        assert params.structured_outputs.reasoning_end_token_ids == []  # the caller's
        return sent.pop().sampling_params.structured_outputs.reasoning_end_token_ids, llm

    offline, llm = sent_end_ids(reason_parser, None)
    ctx = ServingContext(engine=AsyncLLM(_Client(), llm.tokenizer, 64), model_name="m",
                         reasoning_parser=get_reasoning_parser(reason_parser))
    body = ChatCompletionRequest(messages=messages, max_tokens=2,
                                 structured_outputs={"regex": "[0-9]+"})
    _, served, _ = asyncio.run(ChatServer(ctx).prepare(body))
    assert offline == served.structured_outputs.reasoning_end_token_ids
    assert offline == llm.tokenizer.encode("</reason>", add_special_tokens=False) != []
    assert offline != llm.tokenizer.encode("</think>", add_special_tokens=False)
    # without a reasoning parser, as the server without one: no gate, even when asked for
    assert sent_end_ids(None, True)[0] == []
