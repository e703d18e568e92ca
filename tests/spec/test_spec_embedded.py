"""Speculative decoding on the embedded model: greedy output equals non-speculative greedy,
token for token, for each proposer, alone and batched, with prefix-cache hits, chunked prefill
and preemption; after every step no block leaks and the radix cache indexes only tokens of the
true outputs (never a rejected draft)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from radixserve import SamplingParams
from radixserve.config import SpeculativeConfig
from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_manager import KVCacheManager
from radixserve.core.kv.radix_cache import RadixCache
from radixserve.core.scheduler import Scheduler
from radixserve.spec.factory import make_spec

PROMPTS = ["1, 2, 3, 4, 5, 6, 7, 8,", "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
           "The capital of France is"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
METHODS = ["ngram", "suffix"]


@pytest.fixture(scope="module")
def reference(embedded_llm):
    """Greedy outputs without speculation (alone), and prompt + output of each."""
    tok = embedded_llm.get_tokenizer()
    outs = [embedded_llm.generate(p, GREEDY)[0].outputs[0].token_ids for p in PROMPTS]
    return outs, [tok.encode(p) + o for p, o in zip(PROMPTS, outs)]


class speculating:
    """Run the shared LLM with a fresh scheduler (own radix cache over the same KV pool) that
    drafts with ``method``, checking integrity after every step; restore afterwards."""

    def __init__(self, llm, method, truths, num_blocks=None, block_size=None, adaptive=False,
                 **sched_changes):
        self.engine = llm.engine
        self.old = self.engine.scheduler
        kv = self.old.kv
        block_size = block_size or kv.block_size
        pool = BlockPool(num_blocks or kv.block_pool.num_blocks)
        self.spec = make_spec(SpeculativeConfig(method, 4, adaptive))
        self.new = Scheduler(replace(self.old.config, **sched_changes),
                             KVCacheManager(pool, RadixCache(pool, block_size), block_size),
                             self.old.max_model_len, self.spec)
        self.block_size = block_size
        self.truths = truths
        self.steps = 0

    def __enter__(self):
        self.old.kv.prefix_cache.evict(self.old.kv.block_pool.num_blocks)
        self.engine.scheduler = self.new
        self.engine.runner.block_size = self.block_size
        step = self.engine.step

        def checked_step():
            out = step()
            self.check()
            return out

        self.engine.step = checked_step
        return self

    def check(self):
        self.steps += 1
        self.new.check_integrity()
        for path in _cached_paths(self.new.kv.prefix_cache.root):
            assert any(t[:len(path)] == path for t in self.truths), \
                "the radix cache indexes a token sequence that no request generated"
        for r in self.new.running:  # blocks never exceed what the request's tokens need
            assert len(r.block_ids) <= self.new.kv.num_blocks_for(r.num_tokens + 1)

    def __exit__(self, *exc):
        del self.engine.step
        self.new.kv.prefix_cache.evict(self.new.kv.block_pool.num_blocks)
        pool = self.new.kv.block_pool
        assert pool.num_free_blocks == pool.num_blocks, "a KV block leaked"
        self.engine.scheduler = self.old
        self.engine.runner.block_size = self.old.kv.block_size


def _cached_paths(root):
    """Every root-to-node token path of the radix tree."""
    stack = [(root, [])]
    while stack:
        node, path = stack.pop()
        for child in node.children.values():
            p = path + list(child.key)
            yield p
            stack.append((child, p))


def token_ids(results):
    return [r.outputs[0].token_ids for r in results]


@pytest.mark.parametrize("method", METHODS)
def test_greedy_alone_batched_and_cached(embedded_llm, reference, method):
    outs, truths = reference
    with speculating(embedded_llm, method, truths) as s:
        assert token_ids(embedded_llm.generate(PROMPTS[:1], GREEDY)) == outs[:1]
        assert token_ids(embedded_llm.generate(PROMPTS, GREEDY)) == outs  # + cache hits
        assert s.new.kv.num_hit_tokens > 0
    assert s.spec.num_accepted_tokens > 0, "the counting prompt should accept drafts"
    assert s.spec.num_accepted_tokens < s.spec.num_draft_tokens  # and reject some
    # the per-position counters (in /metrics) add up to the totals, position by position
    assert sum(s.spec.drafted_per_pos) == s.spec.num_draft_tokens
    assert sum(s.spec.accepted_per_pos) == s.spec.num_accepted_tokens
    assert s.spec.drafted_per_pos[0] == s.spec.num_drafts
    assert all(a <= d for a, d in zip(s.spec.accepted_per_pos, s.spec.drafted_per_pos))


def test_greedy_with_non_drafting_requests(embedded_llm, reference):
    """Requests whose grammar-free drafts exist share steps with requests that have none
    (logprobs asked: every output token still gets its logprob)."""
    outs, truths = reference
    with speculating(embedded_llm, "ngram", truths) as s:
        res = embedded_llm.generate(PROMPTS, [GREEDY.clone(logprobs=2), GREEDY, GREEDY])
        assert token_ids(res) == outs
        o = res[0].outputs[0]
        assert len(o.logprobs) == len(o.token_ids)
        for t, entry in zip(o.token_ids, o.logprobs):
            assert entry[t].logprob == max(lp.logprob for lp in entry.values())


def test_chunked_prefill(embedded_llm, reference):
    outs, truths = reference
    with speculating(embedded_llm, "suffix", truths, max_num_batched_tokens=5):
        assert token_ids(embedded_llm.generate(PROMPTS, GREEDY)) == outs


def test_preemption_mid_draft(embedded_llm, reference):
    outs, truths = reference
    with speculating(embedded_llm, "ngram", truths, num_blocks=14, block_size=4) as s:
        preempted = []
        original = s.new._preempt

        def spy(request):
            preempted.append(request.request_id)
            original(request)

        s.new._preempt = spy
        assert token_ids(embedded_llm.generate(PROMPTS, GREEDY)) == outs
        assert preempted, "the tiny pool should have forced preemption"
    assert s.spec.num_accepted_tokens > 0


def test_stop_and_max_tokens_inside_a_draft(embedded_llm, reference):
    outs, truths = reference
    with speculating(embedded_llm, "ngram", truths):
        for n in (1, 2, 5, 9):
            assert token_ids(embedded_llm.generate(PROMPTS[0], GREEDY.clone(max_tokens=n))) \
                == [outs[0][:n]]
        stop = outs[0][6]
        out = embedded_llm.generate(PROMPTS[0], GREEDY.clone(stop_token_ids=[stop],
                                                             ignore_eos=False))[0].outputs[0]
        assert out.token_ids == outs[0][:outs[0].index(stop) + 1]


def test_seeded_sampling_independent_of_drafts_and_batch(embedded_llm, reference):
    _, truths = reference
    params = SamplingParams(temperature=0.8, seed=7, max_tokens=16, ignore_eos=True)
    plain = embedded_llm.generate(PROMPTS[0], params)[0].outputs[0].token_ids
    with speculating(embedded_llm, "ngram", truths + [[]]) as s:
        s.truths = None  # sampled outputs: the cache path check does not apply
        s.check = lambda: s.new.check_integrity()
        alone = embedded_llm.generate(PROMPTS[0], params)[0].outputs[0].token_ids
        batch = embedded_llm.generate(PROMPTS, [params, SamplingParams(temperature=1.0),
                                                GREEDY])[0].outputs[0].token_ids
    assert alone == batch == plain
    assert s.spec.num_draft_tokens > 0


def test_default_is_auto(embedded_llm):
    spec = embedded_llm.engine.scheduler.spec
    assert spec.enabled and spec.proposer.name == "suffix" and spec.policy.adaptive
