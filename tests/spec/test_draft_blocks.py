"""The draft pool's bookkeeping (spec/draft_model.py, plain Python): exact block ids through
plan → take → free, what a proposal is valid for, and the scheduler's hooks (preemption and
abort free the draft KV at once), with a fake runner."""

from __future__ import annotations

import pytest

from radixserve.config import SpeculativeConfig
from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_manager import KVCacheManager
from radixserve.core.kv.radix_cache import RadixCache
from radixserve.core.request import Request
from radixserve.core.sched_config import SchedulerConfig
from radixserve.core.sched_output import DraftResult, ModelRunnerOutput, Proposal, ScheduledSeq
from radixserve.core.scheduler import Scheduler
from radixserve.sampling_params import SamplingParams
from radixserve.spec.draft_model import DraftModelProposer, make_draft_spec
from radixserve.spec.policy import SpecPolicy, SpecState


def _seq(rid="a", n=1):
    return ScheduledSeq(rid, [1] * n, 0, [], True)


def test_plan_take_free_pin_block_ids():
    p = DraftModelProposer(BlockPool(6), block_size=4)
    s = _seq()
    assert p.plan(s, max_num_tokens=6, k=3)  # KV of 6 + 2 tokens: 2 blocks
    assert s.draft_work.block_ids == [0, 1]
    assert (s.draft_work.num_confirmed, s.draft_work.spec_token_ids) == (0, [])
    p.take("a", Proposal([7, 8, 9], num_confirmed=5))  # KV of 5 + 2 tokens: 2 blocks kept
    assert p.propose("a", [0] * 5, 3, 4).tokens == [7, 8, 9]
    assert p.propose("a", [0] * 5, 3, 2).tokens == [7, 8]
    assert p.propose("a", [0] * 6, 3, 4).tokens == []  # a forced token came since: stale
    s = _seq()
    assert p.plan(s, max_num_tokens=11, k=4)  # 14 tokens: 4 blocks
    assert s.draft_work.block_ids == [0, 1, 2, 3]
    assert (s.draft_work.num_confirmed, s.draft_work.spec_token_ids) == (5, [7, 8])
    assert not p.plan(_seq("b"), max_num_tokens=12, k=1)  # 3 blocks, 2 free: no draft work
    p.take("a", Proposal([1], num_confirmed=6))  # KV of 6 tokens: blocks 2, 3 back
    assert list(p.pool.free_queue) == [4, 5, 2, 3]
    p.check_integrity(["a"])
    with pytest.raises(AssertionError, match="finished request"):
        p.check_integrity([])
    p.free("a")
    p.take("a", Proposal([1], 6))  # a proposal for a request that finished: ignored
    p.check_integrity([])
    assert p.pool.num_free_blocks == 6


class _FakeRunner:
    """Emits token 4 (rejecting every draft) and proposes [3, 3] for every sampling sequence
    with draft work."""

    def execute(self, sched):
        seqs = [s for s in sched.seqs if s.sample]
        out = ModelRunnerOutput([s.request_id for s in seqs], [4] * len(seqs),
                                [None] * len(seqs), [None] * len(seqs),
                                {s.request_id: DraftResult(s.num_draft, 0, [], [], [])
                                 for s in seqs if s.num_draft})
        out.proposals = {s.request_id: Proposal([3, 3], len(s.prompt_token_ids)
                                                + len(s.output_token_ids) + 1)
                         for s in seqs if s.draft_work is not None}
        return out


def _scheduler(num_blocks=8, draft_blocks=8):
    pool = BlockPool(num_blocks)
    kv = KVCacheManager(pool, RadixCache(pool, 4), 4)
    spec = make_draft_spec(SpeculativeConfig("draft", 2, False, "d"), draft_blocks, 4)
    return Scheduler(SchedulerConfig(max_num_batched_tokens=64), kv, 64, spec), spec


def _request(rid, n=6, max_tokens=8):
    return Request(rid, list(range(10, 10 + n)), SamplingParams(max_tokens=max_tokens),
                   frozenset(), 0, 0.0, 0, max_tokens)


def test_scheduler_plans_drafts_and_frees_on_abort():
    sched, spec = _scheduler()
    sched.add_request(_request("a"))
    out = sched.schedule()  # the prompt; the draft model proposes after it
    (seq,) = out.seqs
    assert seq.draft_work.num_propose == 2 and seq.draft_work.num_confirmed == 0
    sched.update_from_output(out, _FakeRunner().execute(out))
    sched.check_integrity()
    out = sched.schedule()  # the decode feeds the proposal as its draft
    assert out.seqs[0].draft_token_ids == [3, 3]
    assert spec.proposer.num_blocks_of("a") > 0
    sched.abort_requests(["a"])
    sched.check_integrity()
    assert spec.proposer.pool.num_free_blocks == 8


def test_preemption_frees_the_draft_kv():
    sched, spec = _scheduler(num_blocks=4)
    for rid in ("a", "b"):
        sched.add_request(_request(rid, n=6, max_tokens=8))
    runner = _FakeRunner()
    preempted = []
    for _ in range(12):
        out = sched.schedule()
        preempted += out.preempted_ids
        for rid in out.preempted_ids:
            assert spec.proposer.num_blocks_of(rid) == 0
        if out.is_empty:
            break
        sched.update_from_output(out, runner.execute(out))
        sched.check_integrity()
    assert preempted


def test_the_draft_models_forward_enters_the_cost_model():
    """A draft forward as dear as a target step (a model drafting for itself) never pays:
    k = 0; one a tenth of it still lets a well-accepting request draft."""
    policy = SpecPolicy(k_max=4)
    assert policy.cost.points() == []
    for n in (1, 2, 4, 8):  # 10 ms + 0.1 ms per token
        policy.cost.observe(n, 0.010 + 0.0001 * n)
    assert policy.cost.seconds(1) == pytest.approx(0.0101)
    good = SpecState(alpha=0.9, num_drafted=8, num_accepted=8)  # its own estimate
    assert policy.draft_lens([good], 1, 1) == [4]
    # k tokens make 1 + 0.9 + ... + 0.9^k in T(1 + k) + k * d seconds; the best k wins
    assert policy.draft_lens([good], 1, 1, proposer_s=0.001) == [4]  # 4.10 / 14.5 ms
    assert policy.draft_lens([good], 1, 1, proposer_s=0.007) == [2]  # 2.71 / 24.3 ms
    assert policy.draft_lens([good], 1, 1, proposer_s=0.0101) == [0]  # as dear as the target
