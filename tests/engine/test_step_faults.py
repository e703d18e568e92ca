"""Fault isolation inside the engine core, on a tiny random-weight model and the real runner:
an exception while stepping fails only the requests it belongs to (the step's batch for a
forward or sampling error, one request for its grammar's), their KV blocks are freed, and the
engine goes on serving others with the same greedy tokens as a run without faults."""

from __future__ import annotations

import asyncio

import pytest
from tiny_models import make_hf_model

from radixserve import LLM
from radixserve.frontend.async_llm import AsyncLLM, EngineStepError
from radixserve.core.reports import EngineCoreOutput
from radixserve.messages import EngineCoreRequest
from radixserve.frontend.output_buffer import OutputBuffer
from radixserve.frontend.output_processor import RequestState
from radixserve.runner import fault_injection
from radixserve.runner.fault_injection import FaultPlan, FaultyRunner, InjectedFault
from radixserve.sampling_params import SamplingParams

PROMPTS = {"a": [5, 6, 7, 8, 9, 10], "b": [11, 12, 13, 14, 15], "c": [16, 17, 18, 19, 20, 21]}
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = make_hf_model("llama", tmp_path_factory.mktemp("faults") / "m", seed=5)
    # two seats: a third request waits outside the batch
    return LLM(str(path), num_kv_blocks=64, block_size=4, max_num_seqs=2, show_progress=False)


@pytest.fixture
def engine(llm):
    """The engine with its own runner back after each test."""
    runner = llm.engine.runner
    yield llm.engine
    llm.engine.runner = runner


@pytest.fixture(scope="module")
def reference(llm):
    """Each prompt's greedy tokens, alone, without faults."""
    result = {}
    for rid, prompt in PROMPTS.items():
        add(llm.engine, rid, prompt)
        result[rid] = run(llm.engine)[rid][0]
    return result


def add(engine, rid: str, prompt: list[int], max_tokens: int = MAX_TOKENS) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    engine.add_request(EngineCoreRequest(request_id=rid, prompt_token_ids=prompt,
                                         sampling_params=params))


def run(engine, limit: int = 100) -> dict[str, list]:
    """Step until idle; {rid: [tokens, finish_reason, error]}; then nothing may be left."""
    result: dict[str, list] = {}
    for _ in range(limit):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step().outputs:
            entry = result.setdefault(out.request_id, [[], None, None])
            entry[0] += out.new_token_ids
            entry[1], entry[2] = out.finish_reason, out.error
    assert_idle(engine)
    return result


def assert_idle(engine) -> None:
    engine.scheduler.check_integrity()
    stats = engine.scheduler.stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_usage) == (0, 0, 0.0), stats
    assert not engine.scheduler.requests


@pytest.mark.parametrize("kind", ["forward", "sample"])
def test_a_failed_step_fails_its_batch_and_the_engine_goes_on(engine, reference, kind):
    engine.runner = FaultyRunner(engine.runner, FaultPlan.parse(f"{kind}@2"))
    for rid in ("a", "b", "c"):  # a and b take the two seats; c waits
        add(engine, rid, PROMPTS[rid])
    result = run(engine)
    for rid in ("a", "b"):
        tokens, reason, error = result[rid]
        assert reason == "error" and len(tokens) == 1  # the first step's token, then the fault
        assert error == (f"the model step failed: InjectedFault: injected {kind} fault at "
                         "engine step 2")
    # the waiting request was outside the batch: it runs as if nothing had happened
    assert result["c"] == [reference["c"], "length", None]
    # and so do new ones, on the prefix cache the failed ones left (its KV is sound)
    for rid in ("a", "b"):
        add(engine, rid, PROMPTS[rid])
    again = run(engine)
    assert {rid: again[rid][0] for rid in ("a", "b")} == {r: reference[r] for r in ("a", "b")}


class RaisingGrammar:
    """A grammar (NoGrammar's interface) whose ``accept`` raises on its ``fail_at``-th token:
    a bug in one request's structured output."""

    pending_compile = None
    is_ready = True
    is_active = False
    is_terminated = False
    error = None
    matcher = None

    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at

    def accept(self, token_id: int, output_token_ids: list[int]) -> str | None:
        """None: accepted (RequestGrammar's interface: an error message otherwise)."""
        if len(output_token_ids) == self.fail_at:
            raise KeyError("matcher state lost")
        return None

    def forced_tokens(self) -> list[int]:
        return []

    can_draft = True

    def draftable(self, draft: list[int]) -> list[int]:
        return draft


def test_a_grammar_error_fails_only_its_request(engine, reference):
    add(engine, "a", PROMPTS["a"])
    add(engine, "b", PROMPTS["b"])
    engine.scheduler.requests["a"].grammar = RaisingGrammar(fail_at=3)
    result = run(engine)
    tokens, reason, error = result["a"]
    assert reason == "error" and tokens == reference["a"][:3]
    assert error == ("the request's structured output grammar failed: KeyError: "
                     "'matcher state lost'")
    assert result["b"] == [reference["b"], "length", None]  # same batch, unaffected


def test_a_fault_outside_the_runner_fails_every_request_and_the_engine_goes_on(
        engine, reference, monkeypatch):
    schedule = engine.scheduler.schedule
    calls = 0

    def broken_once():
        nonlocal calls
        calls += 1
        if calls == 2:
            raise AssertionError("scheduler invariant broken")
        return schedule()

    monkeypatch.setattr(engine.scheduler, "schedule", broken_once)
    for rid in ("a", "b", "c"):
        add(engine, rid, PROMPTS[rid])
    result = run(engine)
    assert {rid: r[1] for rid, r in result.items()} == dict.fromkeys("abc", "error")
    assert result["c"][2] == ("the engine step failed: AssertionError: scheduler invariant "
                              "broken")
    add(engine, "c", PROMPTS["c"])
    assert run(engine)["c"] == [reference["c"], "length", None]


def test_fault_plans_parse_and_are_off_unless_the_variable_is_set(llm, monkeypatch):
    plan = FaultPlan.parse("forward@3, sample@7")
    assert plan.faults == (("forward", 3), ("sample", 7))
    assert (plan.kind_at(3), plan.kind_at(7), plan.kind_at(4)) == ("forward", "sample", None)
    for bad in ("forward", "kernel@2", "forward@0", "sample@x", ","):
        with pytest.raises(ValueError, match="RADIXSERVE_FAULT_INJECT"):
            FaultPlan.parse(bad)
    runner = llm.engine.runner
    monkeypatch.delenv(fault_injection.ENV_VAR, raising=False)
    assert fault_injection.inject_faults_from_env(runner) is runner
    monkeypatch.setenv(fault_injection.ENV_VAR, "sample@2")
    wrapped = fault_injection.inject_faults_from_env(runner)
    assert isinstance(wrapped, FaultyRunner) and wrapped.plan.faults == (("sample", 2),)
    assert wrapped.kv_caches is runner.kv_caches  # everything else is the runner's


def test_the_faulty_runner_restores_the_runner_after_its_step(engine):
    runner = engine.runner
    sampler, hooks = runner.sampler, dict(runner.model._forward_hooks)
    engine.runner = FaultyRunner(runner, FaultPlan.parse("forward@1,sample@2"))
    add(engine, "a", PROMPTS["a"])
    sched = engine.scheduler.schedule()
    for _ in range(2):
        with pytest.raises(InjectedFault):
            engine.runner.execute(sched)
    assert runner.sampler is sampler and dict(runner.model._forward_hooks) == hooks
    assert engine.runner.execute(sched).request_ids == ["a"]
    engine.abort_requests(["a"])
    assert_idle(engine)


class _FakeClient:
    """EngineCoreClient's request side: records what is added and aborted."""

    def __init__(self) -> None:
        self.buffers: dict[str, OutputBuffer] = {}
        self.aborted: list[str] = []

    async def add_request(self, request, buffer) -> None:
        self.buffers[request.request_id] = buffer

    async def abort(self, request_ids) -> None:
        self.aborted += request_ids


def test_an_error_turning_tokens_into_text_fails_its_request_only(llm, monkeypatch):
    client = _FakeClient()
    engine = AsyncLLM(client, llm.tokenizer, 64)
    process = RequestState.process

    def failing(state, out):  # a detokenizer bug hit by the second sample
        if state.index == 1:
            raise UnicodeError("bad byte table")
        return process(state, out)

    monkeypatch.setattr(RequestState, "process", failing)

    async def collect(gen, indices):
        async for delta in gen:
            indices.append(delta.index)

    async def main():
        indices: list[int] = []
        task = asyncio.ensure_future(
            collect(engine.generate([5, 6, 7], SamplingParams(max_tokens=4, n=2), "req"),
                    indices))
        await asyncio.sleep(0)  # both samples are queued; generate waits for outputs
        for rid in ("req-0", "req-1"):
            client.buffers[rid].put(EngineCoreOutput(rid, [20]))
        with pytest.raises(EngineStepError) as info:
            await task
        return indices, info.value

    indices, error = asyncio.run(main())
    assert str(error) == "processing the request's output failed: UnicodeError: bad byte table"
    assert indices == [0]  # the first sample's delta went out before the fault
    assert sorted(client.aborted) == ["req-0", "req-1"]  # the engine forgets both samples
