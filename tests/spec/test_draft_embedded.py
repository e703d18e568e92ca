"""The draft-model proposer on the embedded model drafting for itself (the same weights, a KV
pool of its own): acceptance 1.0 under greedy and output token for token greedy decoding's,
alone and batched with requests that do not draft, with prefix-cache hits, chunked prefill,
preemption mid-draft and abort; after every step neither the target's nor the draft's pool
leaks a block and the radix cache indexes only true outputs."""

from __future__ import annotations

import pytest
from test_spec_embedded import GREEDY, PROMPTS, reference, speculating, token_ids  # noqa: F401

from radixserve import SamplingParams
from radixserve.config import SpeculativeConfig
from radixserve.messages import EngineCoreRequest
from radixserve.models.loader import device_and_dtype
from radixserve.runner.draft_runner import NO_DRAFT_RUNNER, DraftRunner
from radixserve.runner.model_runner import ModelRunner
from radixserve.spec.draft_model import make_draft_spec

DRAFT_BLOCKS = 96


class self_drafting(speculating):
    """``speculating`` with the embedded model as its own draft: a second ModelRunner over
    the same module (no second copy of the weights) with its own pool of ``draft_blocks``."""

    def __init__(self, llm, truths, draft_blocks=DRAFT_BLOCKS, k=4, adaptive=False,
                 **changes):
        super().__init__(llm, "ngram", truths, adaptive=adaptive, **changes)  # then replaced
        target = self.engine.runner
        self.spec = make_draft_spec(SpeculativeConfig("draft", k, adaptive, "self"),
                                    draft_blocks, self.block_size)
        self.new.spec = self.spec
        draft = ModelRunner(target.model, target.config, draft_blocks, self.block_size,
                            target.device, device_and_dtype(llm.config.device)[1],
                            kv_dtype=target.kv_caches[0][0].dtype)
        self.drafter = DraftRunner(draft, "self")

    def __enter__(self):
        super().__enter__()
        self.engine.runner.drafter = self.drafter
        return self

    def __exit__(self, *exc):
        self.engine.runner.drafter = NO_DRAFT_RUNNER
        pool = self.spec.proposer.pool
        assert pool.num_free_blocks == pool.num_blocks, "a draft KV block leaked"
        super().__exit__(*exc)


def test_self_draft_accepts_everything_alone_batched_and_cached(embedded_llm, reference):
    outs, truths = reference
    with self_drafting(embedded_llm, truths) as s:
        assert token_ids(embedded_llm.generate(PROMPTS[:1], GREEDY)) == outs[:1]
        assert token_ids(embedded_llm.generate(PROMPTS, GREEDY)) == outs  # + cache hits
        assert s.new.kv.num_hit_tokens > 0
    assert s.spec.num_draft_tokens > 0
    assert s.spec.num_accepted_tokens == s.spec.num_draft_tokens  # acceptance 1.0


def test_self_draft_with_requests_that_do_not_draft(embedded_llm, reference):
    """A request 2 tokens from its max_tokens never drafts; logprobs still come per token."""
    outs, truths = reference
    with self_drafting(embedded_llm, truths) as s:
        res = embedded_llm.generate(PROMPTS, [GREEDY.clone(logprobs=2), GREEDY,
                                              GREEDY.clone(max_tokens=2)])
        assert token_ids(res) == [outs[0], outs[1], outs[2][:2]]
        o = res[0].outputs[0]
        assert len(o.logprobs) == len(o.token_ids)
    assert s.spec.num_accepted_tokens == s.spec.num_draft_tokens > 0


SHORT = GREEDY.clone(max_tokens=12)  # the slower cases: fewer tokens


def test_self_draft_chunked_prefill(embedded_llm, reference):
    outs, truths = reference
    with self_drafting(embedded_llm, truths, max_num_batched_tokens=5) as s:
        assert token_ids(embedded_llm.generate(PROMPTS[:2], SHORT)) == [o[:12] for o in outs[:2]]
    assert s.spec.num_accepted_tokens == s.spec.num_draft_tokens > 0


def test_self_draft_preemption_mid_draft(embedded_llm, reference):
    """A tiny target pool preempts (the draft KV is freed and recomputed on resume); a tiny
    draft pool makes some requests skip drafting. Both give the same greedy output."""
    outs, truths = reference
    with self_drafting(embedded_llm, truths, draft_blocks=12, num_blocks=14,
                       block_size=4) as s:
        preempted, original = [], s.new._preempt

        def spy(request):
            assert s.spec.proposer.num_blocks_of(request.request_id) >= 0
            original(request)
            assert s.spec.proposer.num_blocks_of(request.request_id) == 0
            preempted.append(request.request_id)

        s.new._preempt = spy
        assert token_ids(embedded_llm.generate(PROMPTS, SHORT)) == [o[:12] for o in outs]
        assert preempted, "the tiny pool should have forced preemption"
    assert s.spec.num_accepted_tokens == s.spec.num_draft_tokens > 0


def test_self_draft_stop_inside_a_draft_and_abort(embedded_llm, reference):
    outs, truths = reference
    with self_drafting(embedded_llm, truths) as s:
        for n in (1, 3, 6):
            assert token_ids(embedded_llm.generate(PROMPTS[0], GREEDY.clone(max_tokens=n))) \
                == [outs[0][:n]]
        engine = embedded_llm.engine
        tok = embedded_llm.get_tokenizer()
        for i, prompt in enumerate(PROMPTS):
            engine.add_request(EngineCoreRequest(request_id=f"abort-{i}",
                                                 prompt_token_ids=tok.encode(prompt),
                                                 sampling_params=GREEDY))
        for _ in range(4):
            engine.step()
        assert s.spec.proposer.pool.num_free_blocks < DRAFT_BLOCKS  # drafting now
        engine.abort_requests([f"abort-{i}" for i in range(len(PROMPTS))])
        s.new.check_integrity()
        assert s.spec.proposer.pool.num_free_blocks == DRAFT_BLOCKS  # freed at once


def test_self_draft_seeded_sampling_unchanged(embedded_llm, reference):
    _, truths = reference
    params = SamplingParams(temperature=0.8, seed=7, max_tokens=10, ignore_eos=True)
    plain = embedded_llm.generate(PROMPTS[0], params)[0].outputs[0].token_ids
    with self_drafting(embedded_llm, truths) as s:
        s.check = lambda: s.new.check_integrity()  # sampled outputs: no cache path check
        alone = embedded_llm.generate(PROMPTS[0], params)[0].outputs[0].token_ids
        batch = embedded_llm.generate(PROMPTS, [params, SamplingParams(temperature=1.0),
                                                GREEDY])[0].outputs[0].token_ids
    assert alone == batch == plain
    assert s.spec.num_accepted_tokens > 0


@pytest.mark.parametrize("k", [1, 7])
def test_self_draft_lengths(embedded_llm, reference, k):
    """k = 1: the catch-up alone proposes; k = 7: the longest drafts."""
    outs, truths = reference
    with self_drafting(embedded_llm, truths, k=k) as s:
        assert token_ids(embedded_llm.generate(PROMPTS[:2], SHORT)) == [o[:12] for o in outs[:2]]
    assert s.spec.num_accepted_tokens == s.spec.num_draft_tokens > 0
    assert max(i for i, n in enumerate(s.spec.accepted_per_pos) if n) == k - 1


def test_adaptive_self_draft_still_exact(embedded_llm, reference):
    outs, truths = reference
    with self_drafting(embedded_llm, truths, adaptive=True) as s:
        assert token_ids(embedded_llm.generate(PROMPTS, GREEDY)) == outs
    assert s.spec.forward_s > 0  # the draft model's forward was measured for the policy
