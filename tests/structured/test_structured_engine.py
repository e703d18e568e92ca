"""Structured output inside the engine core, with a fake runner and the real llguidance backend
on the embedded model's tokenizer: masks, fast-forward, the reasoning gate, compile failures."""

from __future__ import annotations

import itertools
import time

import pytest
import torch

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_manager import KVCacheManager
from radixserve.core.kv.radix_cache import RadixCache
from radixserve.core.sched_config import SchedulerConfig
from radixserve.core.sched_output import ModelRunnerOutput
from radixserve.core.scheduler import Scheduler
from radixserve.engine.engine_core import EngineCore
from radixserve.engine.structured_manager import StructuredOutputManager
from radixserve.messages import EngineCoreRequest
from radixserve.tokenizer.tokenizer import load_tokenizer
from radixserve.models.source import ModelSource
from radixserve.sampling_params import SamplingParams
from radixserve.structured.backend import GrammarError
from radixserve.structured.bitmask import banned_tokens
from radixserve.structured.llguidance_backend import LLGuidanceBackend
from radixserve.structured.params import StructuredOutputsParams as SO

VOCAB = 49152


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(ModelSource.resolve(None))


@pytest.fixture(scope="module")
def backend(tokenizer):
    return LLGuidanceBackend.from_tokenizer(tokenizer, VOCAB)


class FirstAllowedRunner:
    """Constrained rows sample the lowest token id their bitmask allows; unconstrained rows
    take the next token of ``script``. Records, per step, which rows were masked."""

    def __init__(self, script=()):
        self.script = iter(script)
        self.masked: list[list[str]] = []
        self.fed: list[int] = []

    def execute(self, sched, grammar=None):
        self.fed.append(sum(s.num_tokens for s in sched.seqs))
        first = {}
        if grammar is not None:
            banned = banned_tokens(grammar.bitmask.result(), VOCAB)
            for rid, row in zip(grammar.request_ids, banned):
                first[rid] = int((~row).nonzero()[0])
        self.masked.append(sorted(first))
        rows = [s.request_id for s in sched.seqs if s.sample]
        tokens = [first[r] if r in first else next(self.script) for r in rows]
        return ModelRunnerOutput(rows, tokens, [None] * len(rows), [None] * len(rows))


def make_engine(backend, runner, **manager_kwargs):
    pool = BlockPool(64)
    kv = KVCacheManager(pool, RadixCache(pool, 4), 4)
    scheduler = Scheduler(SchedulerConfig(8, 64), kv, 256)
    return EngineCore(scheduler, runner, VOCAB, 0,
                      StructuredOutputManager(backend, **manager_kwargs))


def add(engine, rid, constraint=None, max_tokens=40, eos=(2,), logprobs=None):
    params = SamplingParams(max_tokens=max_tokens, structured_outputs=constraint,
                            logprobs=logprobs)
    engine.add_request(EngineCoreRequest(request_id=rid, prompt_token_ids=[1, 2, 3, 4, 5],
                                         sampling_params=params, eos_token_ids=list(eos)))


def run(engine, limit=100):
    """Step until idle; {rid: (tokens, finish_reason, error)}."""
    result: dict[str, list] = {}
    for _ in range(limit):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step().outputs:
            entry = result.setdefault(out.request_id, [[], None, None])
            entry[0] += out.new_token_ids
            entry[1], entry[2] = out.finish_reason, out.error
    assert not engine.has_unfinished_requests()
    engine.scheduler.check_integrity()
    return result


def test_fast_forward_emits_forced_tokens_without_a_forward_each(backend, tokenizer):
    text = "the quick brown fox jumps over the lazy dog"
    for fast_forward in (True, False):
        runner = FirstAllowedRunner()
        engine = make_engine(backend, runner, fast_forward=fast_forward)
        add(engine, "a", SO(regex=text + " [0-9]"))
        tokens, reason, error = run(engine)["a"]
        assert reason == "stop" and error is None
        assert tokenizer.decode(tokens) == text + " 0"
        if fast_forward:  # one sampled token, the forced rest fed as one chunk, the digit
            assert len(runner.fed) == 2 and runner.fed[1] == len(tokens) - 1
        else:
            assert runner.fed[1:] == [1] * (len(tokens) - 1)


def test_logprobs_requests_are_not_fast_forwarded(backend, tokenizer):
    runner = FirstAllowedRunner()
    engine = make_engine(backend, runner)
    add(engine, "a", SO(regex="abc abc abc"), logprobs=0)
    tokens, reason, _ = run(engine)["a"]
    assert tokenizer.decode(tokens) == "abc abc abc" and len(runner.fed) == len(tokens)


def test_fast_forward_respects_max_tokens(backend, tokenizer):
    engine = make_engine(backend, FirstAllowedRunner())
    add(engine, "a", SO(regex="one two three four five six seven eight"), max_tokens=3)
    tokens, reason, _ = run(engine)["a"]
    assert len(tokens) == 3 and reason == "length"


def test_mask_only_on_constrained_rows_and_eos_only_at_the_end(backend, tokenizer):
    runner = FirstAllowedRunner(script=itertools.repeat(100))
    engine = make_engine(backend, runner, fast_forward=False)
    add(engine, "free", None, max_tokens=5)
    add(engine, "json", SO(choice=["yes", "no"]))
    result = run(engine)
    assert result["free"][0] == [100] * 5 and result["free"][1] == "length"
    assert all(rows == ["json"] for rows in runner.masked if rows)
    assert tokenizer.decode(result["json"][0]) in ("yes", "no")
    # an eos is never allowed before the grammar may end
    grammar = backend.compile(SO(choice=["yes", "no"]).spec())
    bitmask = backend.allocate_bitmask(1)
    backend.fill_bitmask([grammar.new_matcher()], bitmask)
    assert banned_tokens(bitmask, VOCAB)[0, 2]


def test_special_tokens_banned_inside_a_json_string(backend, tokenizer):
    grammar = backend.compile(SO(json={"type": "object", "properties": {
        "s": {"type": "string"}}, "required": ["s"]}).spec())
    matcher = grammar.new_matcher()
    for token in tokenizer.encode('{"s": "abc', add_special_tokens=False):
        assert matcher.accept_token(token)
    bitmask = backend.allocate_bitmask(1)
    backend.fill_bitmask([matcher], bitmask)
    banned = banned_tokens(bitmask, VOCAB)[0]
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert banned[tokenizer.backend.token_to_id(special)]
    assert not banned[tokenizer.encode("d", add_special_tokens=False)[0]]


def test_constraint_starts_after_the_reasoning_end(backend, tokenizer):
    end = tokenizer.encode("</think>", add_special_tokens=False)
    thought = tokenizer.encode("hmm, let me see", add_special_tokens=False)
    runner = FirstAllowedRunner(script=thought + end)
    engine = make_engine(backend, runner)
    add(engine, "a", SO(regex="4[0-9]", reasoning_end_token_ids=end))
    tokens, reason, _ = run(engine)["a"]
    assert tokenizer.decode(tokens) == "hmm, let me see</think>40" and reason == "stop"
    num_free = len(thought) + len(end)
    assert runner.masked[:num_free] == [[]] * num_free and runner.masked[num_free] == ["a"]


class SlowBackend:
    """Wraps a backend; compile takes ``delay`` seconds (asleep, as a compile starved of CPU
    by a busy machine; or ``busy``: spinning, as a compile too complex) or raises ``error``."""

    def __init__(self, inner, delay=0.0, error=None, busy=False):
        self.inner, self.delay, self.error, self.busy = inner, delay, error, busy
        self.vocab_size = inner.vocab_size
        self.num_compiles = 0

    def validate(self, spec):
        self.inner.validate(spec)

    def compile(self, spec):
        self.num_compiles += 1
        if self.busy:  # this much CPU time of its own, however busy the machine is
            end = time.thread_time() + self.delay
            while time.thread_time() < end:
                pass
        else:
            time.sleep(self.delay)
        if self.error:
            raise GrammarError(self.error)
        return self.inner.compile(spec)

    def allocate_bitmask(self, n):
        return self.inner.allocate_bitmask(n)

    def token_bytes(self):
        return self.inner.token_bytes()

    def fill_bitmask(self, matchers, bitmask):
        self.inner.fill_bitmask(matchers, bitmask)


def test_a_slow_compile_does_not_stall_other_requests(backend, tokenizer):
    slow = SlowBackend(backend, delay=0.5)
    runner = FirstAllowedRunner(script=itertools.repeat(100))
    engine = make_engine(slow, runner)
    add(engine, "json", SO(regex="ok"))
    add(engine, "free", None, max_tokens=3)
    start = time.monotonic()
    out = engine.step().outputs
    assert [o.request_id for o in out] == ["free"] and time.monotonic() - start < 0.4
    # idle steps wait at most 5 ms each for the compile: allow far more than 0.5 s of them
    result = run(engine, limit=2000)
    assert tokenizer.decode(result["json"][0]) == "ok" and result["free"][1] == "length"


def test_compiles_are_cached_by_spec(backend):
    slow = SlowBackend(backend)
    engine = make_engine(slow, FirstAllowedRunner())
    for i in range(3):
        add(engine, f"r{i}", SO(json={"type": "object", "properties": {"a": {"const": 1}}}))
    add(engine, "other", SO(regex="x"))
    run(engine)
    assert slow.num_compiles == 2


def test_failed_or_overlong_compile_fails_only_its_request(backend):
    for slow, kwargs, message in [
            (SlowBackend(backend, error="boom"), {}, "boom"),
            (SlowBackend(backend, delay=0.3, busy=True), {"compile_timeout_s": 0.05},
             "used over 0.05 s of CPU time"),
            (SlowBackend(backend, delay=1.5), {"compile_timeout_s": 0.05}, "overloaded")]:
        engine = make_engine(slow, FirstAllowedRunner(script=itertools.repeat(100)), **kwargs)
        add(engine, "bad", SO(regex="x"))
        add(engine, "free", None, max_tokens=2)
        result = run(engine)
        assert result["bad"][1] == "abort" and message in result["bad"][2]
        assert result["free"][0] == [100, 100]


def test_a_compile_slowed_on_the_clock_but_not_in_cpu_time_succeeds(backend):
    # a busy machine: the compile waits (asleep here) for 0.3 s but uses almost no CPU, over
    # a budget of 0.05 CPU seconds (the wall-clock backstop is 12x the budget: 0.6 s)
    engine = make_engine(SlowBackend(backend, delay=0.3), FirstAllowedRunner(),
                         compile_timeout_s=0.05)
    add(engine, "json", SO(regex="ok"))
    result = run(engine, limit=2000)
    assert result["json"][1] != "abort", result["json"]


def test_banned_tokens_matches_bit_arithmetic():
    gen = torch.Generator().manual_seed(0)
    for vocab in (32, 100, 49152):
        words = torch.randint(-2**31, 2**31 - 1, (3, (vocab + 31) // 32), generator=gen,
                              dtype=torch.int64).to(torch.int32)
        token = torch.arange(vocab)
        bits = (words[:, token // 32] >> (token % 32)) & 1
        assert torch.equal(banned_tokens(words, vocab), bits == 0)


def test_invalid_specs_are_value_errors(backend):
    for constraint, needle in [(SO(regex="[a-"), "unclosed"),
                               (SO(json={"type": "objectx"}), "objectx"),
                               (SO(json={"type": "array", "uniqueItems": True, "minItems": 2}), "uniqueItems"),
                               (SO(grammar="start: (("), "grammar"),
                               (SO(json="{not json"), "not valid JSON")]:
        with pytest.raises(ValueError, match=needle):
            backend.validate(constraint.spec())
    with pytest.raises(ValueError, match="exactly one"):
        SO(regex="a", choice=["a"])
    with pytest.raises(ValueError, match="exactly one"):
        SO()


@pytest.mark.usefixtures("kernel_level")
def test_apply_bitmask_native_and_torch_paths_agree(monkeypatch):
    from radixserve.kernels import native
    from radixserve.structured import bitmask as bitmask_mod

    gen = torch.Generator().manual_seed(1)
    for vocab in (32, 100, 49152):
        words = torch.randint(-2**31, 2**31 - 1, (3, (vocab + 31) // 32), generator=gen,
                              dtype=torch.int64).to(torch.int32)
        words[1] = -1  # a row with every token allowed
        logits = torch.randn(5, vocab, generator=gen)
        rows = torch.tensor([4, 0, 2])
        fast, slow = logits.clone(), logits.clone()
        bitmask_mod.apply_bitmask(fast, rows, words)
        with monkeypatch.context() as mp:
            mp.setattr(native, "load", lambda: None)
            bitmask_mod.apply_bitmask(slow, rows, words)
        assert torch.equal(fast, slow)
        assert torch.equal(fast[[1, 3]], logits[[1, 3]])  # rows without a mask untouched


# -- row D of issue 17: grammars at the matcher's limits ------------------------------------

CHOICES = [f"option number {i}" for i in range(50_000)]


def test_a_choice_of_50000_strings_completes(backend, tokenizer):
    """It used to end in "token N broke the request's structured output grammar": one grammar
    rule per string made a parser row of 50,001 items, over llguidance's limit, which the
    matcher hit on consuming the very token its mask had allowed."""
    engine = make_engine(backend, FirstAllowedRunner())
    add(engine, "a", SO(choice=CHOICES))
    tokens, reason, error = run(engine, limit=2000)["a"]
    assert (reason, error) == ("stop", None)
    assert tokenizer.decode(tokens) in CHOICES


def test_a_grammar_beyond_the_lexer_limits_fails_before_its_first_token(backend):
    """``(a{1000}){1000}`` compiles, and its matcher runs out of lexer fuel on the first token
    consumed: the probe at compile time refuses it with the limit named, and a stream next to
    it keeps stepping while it compiles (on the compile thread, not the step loop)."""
    runner = FirstAllowedRunner(script=itertools.repeat(100))
    engine = make_engine(backend, runner)
    add(engine, "free", None, max_tokens=100_000)
    add(engine, "regex", SO(regex="(a{1000}){1000}"))
    gaps, last, start = [], time.monotonic(), time.monotonic()
    result = None
    while result is None:
        for out in engine.step().outputs:
            if out.request_id == "regex":
                result = out
        now = time.monotonic()
        gaps.append(now - last)
        last = now
    compile_s = time.monotonic() - start
    assert result.finish_reason == "abort" and result.new_token_ids == []
    assert "too complex" in result.error and "lexer" in result.error, result.error
    assert "broke" not in result.error
    # (a step that waited for the compile would take all of it; on a loaded 2-core machine a
    # free step takes up to a few tenths of a second, so the bound is a share of the compile)
    assert compile_s > 0.2 and max(gaps) < max(0.15, compile_s / 4), (compile_s, max(gaps))
    engine.abort_requests(["free"])
    engine.step()
    assert not engine.has_unfinished_requests()
    engine.scheduler.check_integrity()


class LimitMatcher:
    """A matcher that refuses every token, as if it had hit ``error`` (None: a plain
    rejection)."""

    def __init__(self, error):
        self.error = error
        self.is_terminated = False

    def accept_token(self, token_id):
        return False


@pytest.mark.parametrize("error, message", [
    ("the regex is too complex for the structured output matcher (x); simplify it",
     "too complex"),
    (None, "token 7 broke"),
])
def test_a_matcher_failure_mid_output_names_its_cause(error, message):
    from concurrent.futures import Future

    from radixserve.structured.request_grammar import RequestGrammar

    compiled = Future()
    compiled.set_result(type("G", (), {"new_matcher": lambda self: LimitMatcher(error)})())
    grammar = RequestGrammar(compiled)
    assert grammar.is_ready
    assert message in grammar.accept(7, [7])
