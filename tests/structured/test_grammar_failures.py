"""A grammar that fails mid-output ends its own request alone (issue 62, item 1).

``(a{1,100}){1,1000}`` compiles and passes the compile-time probe, then runs llguidance's lexer
out of room ("too many expressions constructed") some twenty tokens into an output of ``aaaa``
tokens. The matcher then masks everything but eos and accepts eos as a normal end, so the
request used to finish "stop" (the next request on the same cached compile at once, with
``''``, which the regex does not match); with a draft, filling its rows raised on the mask
thread and failed every request of the step. Now the request ends with finish reason "error"
(vLLM's FINISHED_ERROR: a 500, or an error event in a stream), the others go on, and the spec
is refused up front from then on.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch
from test_structured_engine import run as run_steps

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_manager import KVCacheManager
from radixserve.core.kv.radix_cache import RadixCache
from radixserve.core.sched_config import SchedulerConfig
from radixserve.core.sched_output import ModelRunnerOutput, ScheduledSeq
from radixserve.core.scheduler import Scheduler
from radixserve.engine.engine_core import EngineCore
from radixserve.engine.structured_manager import StructuredOutputManager
from radixserve.messages import EngineCoreRequest
from radixserve.models.source import ModelSource
from radixserve.sampling_params import SamplingParams
from radixserve.structured.bitmask import banned_tokens
from radixserve.structured.llguidance_backend import LLGuidanceBackend
from radixserve.structured.params import StructuredOutputsParams as SO
from radixserve.tokenizer.tokenizer import load_tokenizer

VOCAB = 49152
POISON = "(a{1,100}){1,1000}"  # beyond the lexer's limit after about 80 characters
FREE_TOKEN = 100


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(ModelSource.resolve(None))


@pytest.fixture
def backend(tokenizer):
    """A backend per test: a compile poisoned by one test must not leak into the next."""
    return LLGuidanceBackend.from_tokenizer(tokenizer, VOCAB)


@pytest.fixture(scope="module")
def aaaa(tokenizer):
    [token] = tokenizer.encode("aaaa", add_special_tokens=False)
    return token


class FavouriteRunner:
    """Constrained rows sample ``favourite`` where their mask allows it, else the lowest id it
    allows (a model that writes ``aaaa`` while it may); other rows sample `FREE_TOKEN`."""

    def __init__(self, favourite: int) -> None:
        self.favourite = favourite

    def execute(self, sched, grammar=None):
        chosen = {}
        if grammar is not None:
            banned = banned_tokens(grammar.bitmask.result(), VOCAB)
            for rid, row in zip(grammar.request_ids, banned):
                chosen[rid] = (self.favourite if not row[self.favourite]
                               else int((~row).nonzero()[0]))
        rows = [s.request_id for s in sched.seqs if s.sample]
        tokens = [chosen.get(r, FREE_TOKEN) for r in rows]
        return ModelRunnerOutput(rows, tokens, [None] * len(rows), [None] * len(rows))


def make_engine(backend, runner) -> EngineCore:
    pool = BlockPool(128)
    kv = KVCacheManager(pool, RadixCache(pool, 4), 4)
    return EngineCore(Scheduler(SchedulerConfig(8, 256), kv, 512), runner, VOCAB, 0,
                      StructuredOutputManager(backend))


def add(engine, rid: str, constraint=None, max_tokens: int = 200) -> None:
    params = SamplingParams(max_tokens=max_tokens, structured_outputs=constraint)
    engine.add_request(EngineCoreRequest(request_id=rid, prompt_token_ids=[1, 2, 3, 4, 5],
                                         sampling_params=params, eos_token_ids=[0, 2]))


def run(engine) -> dict[str, list]:
    """Step until idle (the poisoned requests take up to ~1,000 steps); {rid: [tokens,
    finish_reason, error]}."""
    return run_steps(engine, limit=2000)


def test_a_grammar_that_fails_mid_output_ends_its_request_alone(backend, tokenizer, aaaa):
    engine = make_engine(backend, FavouriteRunner(aaaa))
    add(engine, "poison", SO(regex=POISON))
    for i in range(4):
        add(engine, f"free{i}", max_tokens=60)
    result = run(engine)
    tokens, reason, error = result["poison"]
    assert reason == "error", (reason, tokenizer.decode(tokens))
    assert "too complex" in error and "lexer" in error, error
    for i in range(4):  # the same steps as the failure: unaffected
        assert result[f"free{i}"] == [[FREE_TOKEN] * 60, "length", None]


def test_a_spec_that_failed_mid_output_is_refused_before_its_next_request(backend, aaaa):
    """The compile is poisoned (llguidance's lexer is shared by every matcher of it): the next
    request with the spec used to stop at once with ``''``, which the regex does not match."""
    engine = make_engine(backend, FavouriteRunner(aaaa))
    add(engine, "first", SO(regex=POISON))
    assert run(engine)["first"][1] == "error"
    add(engine, "again", SO(regex=POISON))
    add(engine, "free", max_tokens=3)
    result = run(engine)
    assert result["again"][0] == [] and result["again"][1] == "abort"
    assert "too complex" in result["again"][2]
    assert result["free"] == [[FREE_TOKEN] * 3, "length", None]


def test_no_stop_unless_the_output_matches(backend, tokenizer, aaaa):
    """Whatever the runner samples after the failure (eos here: the only token the broken
    matcher's mask allows), the request never ends "stop" with text its regex rejects."""
    import re

    engine = make_engine(backend, FavouriteRunner(aaaa))
    for i in range(3):  # one after another, on the same (cached) compile
        add(engine, f"r{i}", SO(regex=POISON))
        tokens, reason, _ = run(engine)[f"r{i}"]
        if reason == "stop":
            text = tokenizer.decode([t for t in tokens if t not in (0, 2)])
            assert re.fullmatch(POISON, text), text


def test_draft_rows_of_a_failing_grammar_do_not_fail_the_step(backend, tokenizer, aaaa):
    """A draft that runs the matcher into its limit: the step's other constrained request
    gets its rows, the failing one's rows allow everything and its next token ends it."""
    engine = make_engine(backend, FavouriteRunner(aaaa))
    add(engine, "poison", SO(regex=POISON))
    add(engine, "digits", SO(regex="[0-9]{1,6}"))
    requests = engine.scheduler.requests
    for _ in range(1000):
        if all(r.grammar.is_ready for r in requests.values()):
            break
        engine.structured.wait_for_compiles([r.grammar for r in requests.values()], 0.05)
    [one] = tokenizer.encode("1", add_special_tokens=False)
    drafts = {"poison": [aaaa] * 40, "digits": [one, one]}
    seqs = [ScheduledSeq(rid, [7, *draft], 5, [], True, num_draft=len(draft))
            for rid, draft in drafts.items()]
    mask = engine.structured.bitmask(SimpleNamespace(seqs=seqs), requests)
    words = mask.bitmask.result(timeout=60)
    assert mask.request_ids == ["poison"] * 41 + ["digits"] * 3
    assert torch.equal(words[:41], torch.full_like(words[:41], -1))
    digit_rows = ~banned_tokens(words[41:], VOCAB)
    assert digit_rows[:, one].all() and not digit_rows[:, aaaa].any()
    error = requests["poison"].grammar.accept(aaaa, [aaaa])
    assert error is not None and "too complex" in error
    assert requests["digits"].grammar.accept(one, [one]) is None


def test_the_unconstrained_streams_of_a_failing_step_keep_their_tokens(backend, aaaa):
    """Several rounds of poisoned requests beside free streams: every free stream completes
    with all its tokens, whatever step the failures land in."""
    engine = make_engine(backend, FavouriteRunner(aaaa))
    names = itertools.count()
    for _ in range(3):
        add(engine, f"poison{next(names)}", SO(regex=f"(a{{1,{90 + next(names)}}}){{1,1000}}"))
        add(engine, f"free{next(names)}", max_tokens=50)
    result = run(engine)
    for rid, (tokens, reason, error) in result.items():
        if rid.startswith("free"):
            assert (tokens, reason, error) == ([FREE_TOKEN] * 50, "length", None)
        else:
            assert reason == "error" and "too complex" in error, (rid, reason, error)


def test_a_draft_check_that_hits_the_limit_fails_its_request_not_the_step(backend, aaaa):
    """Drafts are checked while the step is scheduled, where an exception fails every request
    of the engine: a matcher that hits its limit on a token `valid_prefix` passed could not
    roll back ("grammar rollback of 3 tokens failed") and took the step down. Now the draft
    is dropped and the request's next token ends it with the limit named (and the spec is
    refused from then on: ``on_limit``)."""
    from concurrent.futures import Future

    from radixserve.structured.request_grammar import RequestGrammar

    failed_in_draft = 0
    for num_accepted in range(8, 20):
        compiled = Future()
        compiled.set_result(backend.compile(SO(regex=POISON).spec()))
        limits = []
        grammar = RequestGrammar(compiled, on_limit=limits.append)
        assert grammar.is_ready
        output = []
        for _ in range(num_accepted):
            output.append(aaaa)
            if grammar.accept(aaaa, output) is not None:
                break
        else:
            draft = grammar.draftable([aaaa] * 4)  # must not raise
            if draft:
                continue
            failed_in_draft += grammar.matcher.error is not None
            if grammar.matcher.error is not None:
                assert not grammar.is_active and not grammar.is_terminated
                error = grammar.accept(FREE_TOKEN, [*output, FREE_TOKEN])
                assert error is not None and "too complex" in error
                assert limits == [error]
    assert failed_in_draft, "no draft ran the matcher into its limit: the test tests nothing"
