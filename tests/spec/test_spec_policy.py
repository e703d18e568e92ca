"""The adaptive draft-length policy on synthetic step costs (no timing): the measured cost
table, and the decisions it leads to on a memory-bound CPU, a compute-bound one, a cost step,
a large batch, and for a request whose drafts keep missing."""

from __future__ import annotations

import pytest

from radixserve.spec.policy import SpecPolicy, SpecState, StepCostModel, evidence_key


def _policy(cost, sizes, k_max=4) -> SpecPolicy:
    """A policy whose cost model has seen each size in ``sizes`` cost ``cost(n)`` seconds."""
    policy = SpecPolicy(k_max)
    for _ in range(3):
        for n in sizes:
            policy.cost.observe(n, cost(n))
    return policy


def test_cost_table_interpolates_extends_and_never_falls():
    model = StepCostModel()
    for n, t in ((1, 0.010), (5, 0.011), (64, 0.040), (128, 0.070)):
        model.observe(n, t)
    assert model.seconds(1) == pytest.approx(0.010)
    assert model.seconds(3) == pytest.approx(0.0105)  # between the 1- and 5-token steps
    assert model.seconds(96) == pytest.approx(0.055)
    assert model.seconds(256) == pytest.approx(0.130)  # the last segment, extended
    model.observe(32, 0.005)  # a (noisy) cheaper mid-size step: more tokens never cost less
    assert [t for _, t in model.points()] == sorted(t for _, t in model.points())


def test_a_slow_small_step_does_not_make_larger_steps_look_free():
    """One stalled 3-token step must not lift the larger buckets to its time (drafts would
    then look free): the smaller bucket is lowered to what larger steps cost instead."""
    model = StepCostModel()
    for n, t in ((1, 0.010), (3, 0.105), (16, 0.026), (80, 0.060)):
        model.observe(n, t)
    assert model.seconds(16) == pytest.approx(0.026)
    assert model.seconds(80) == pytest.approx(0.060)
    assert model.seconds(3) == pytest.approx(0.026)
    policy = SpecPolicy(k_max=4)
    policy.cost = model
    poor = [SpecState(alpha=0.3, num_drafted=8, num_accepted=2) for _ in range(16)]
    assert sum(policy.draft_lens(poor, 16, 16)) == 0  # 16 streams at 0.3: drafting loses


def test_cost_table_forgets_old_steps_and_clips_outliers():
    model = StepCostModel()
    model.observe(4, 0.010)
    model.observe(4, 1.000)  # a step stalled by another process counts as 3x its bucket
    assert model.seconds(4) == pytest.approx((0.010 * 0.9 + 0.030) / 1.9)
    for _ in range(60):
        model.observe(4, 0.020)  # the CPU got slower: the table follows
    assert model.seconds(4) == pytest.approx(0.020, rel=0.01)


def test_unmeasured_cost_takes_64_tokens_as_two_steps():
    model = StepCostModel()
    assert model.seconds(64) == pytest.approx(2 * model.seconds(0))
    model.observe(1, 0.010)
    assert model.seconds(66) == pytest.approx(0.020)


def test_memory_bound_cpu_drafts_and_compute_bound_cpu_does_not():
    # memory-bound (reading the weights dominates): 5 tokens cost 10% more than 1
    memory_bound = _policy(lambda n: 0.010 * (1 + 0.025 * (n - 1)), (1, 2, 3, 4, 5, 200))
    # compute-bound (a slow ISA): every token costs about the same
    compute_bound = _policy(lambda n: 0.001 + 0.010 * n, (1, 2, 3, 4, 5, 200))
    state = SpecState(alpha=0.7, num_drafted=1)
    assert memory_bound.draft_lens([state], num_tokens=1, num_rows=1) == [4]
    assert compute_bound.draft_lens([state], num_tokens=1, num_rows=1) == [0]
    # a poorly predicted request drafts less where drafts are cheap, and nothing at all
    # when the expected gain is under the 3% margin
    assert memory_bound.draft_lens([SpecState(alpha=0.15, num_drafted=1)], 1, 1) == [1]
    assert memory_bound.draft_lens([SpecState(alpha=0.02, num_drafted=1)], 1, 1) == [0]


def test_a_cost_step_does_not_stop_drafting_short():
    # a 2-token step costs 30% more than a 1-token one, 3 to 5 tokens hardly more than 2:
    # one draft token alone does not pay at α = 0.3 (1.3 tokens for 1.3 steps), three do
    policy = _policy(lambda n: 0.010 if n == 1 else 0.013 + 0.0001 * n, (1, 2, 3, 4, 5))
    assert policy.draft_lens([SpecState(alpha=0.3, num_drafted=1)], 1, 1) == [3]


def test_large_batches_draft_only_when_acceptance_pays_for_compute():
    cost = lambda n: 0.008 + 0.0004 * n  # noqa: E731 - compute grows past ~20 tokens
    policy = _policy(cost, (1, 2, 4, 8, 16, 32, 64, 128, 256, 320))
    assert policy.draft_lens([SpecState()] * 64, 64, 64) == [0] * 64  # α = 0.6 prior
    sure = SpecState(alpha=0.98, num_drafted=1)
    lens = policy.draft_lens([sure] * 8 + [SpecState()] * 56, 64, 64)
    assert lens[:8] == [4] * 8 and lens[8:] == [0] * 56  # only the well-predicted ones
    # two of them would gain 2%: under the margin, not worth the noise
    assert policy.draft_lens([sure] * 2 + [SpecState()] * 62, 64, 64) == [0] * 64
    # a small batch drafts, as far as the tokens pay: the third (0.216 expected tokens for
    # 0.4 ms) would make less than the step's 0.6 tokens per ms
    assert policy.draft_lens([SpecState(alpha=0.6, num_drafted=1)] * 4, 4, 4) == [2] * 4


def test_drafts_that_keep_missing_back_off_and_a_hit_resets():
    policy = _policy(lambda n: 0.010 * (1 + 0.025 * (n - 1)), (1, 2, 3, 4, 5))
    state, other = SpecState(alpha=0.9, num_drafted=1), SpecState(alpha=0.9, num_drafted=1)
    waits = []
    for _ in range(5):
        state.record(4, 0)
        waits.append(state.wait)
        while state.wait:
            assert policy.draft_lens([state, other], 2, 2)[0] == 0
            state.idle()
    assert waits == [2, 4, 8, 16, 16]
    assert policy.draft_lens([state], 1, 1) != [0]  # probes again after its wait
    state.record(4, 2)
    assert (state.misses, state.wait) == (0, 0)
    state.record(4, 0)
    assert state.wait == 2  # the backoff starts over


def test_a_new_request_starts_from_the_acceptance_of_all_drafts():
    policy = _policy(lambda n: 0.008 + 0.0004 * n, (1, 2, 4, 8, 16, 32, 64, 128))
    fresh = [SpecState() for _ in range(32)]
    assert policy.draft_lens(fresh, 32, 32) == [0] * 32  # α = 0.6 does not pay at b32
    for _ in range(40):
        policy.record(4, 4)  # the workload's drafts are accepted
    assert policy.draft_lens(fresh, 32, 32) == [4] * 32
    missed = SpecState(alpha=0.5, num_drafted=4)  # its own estimate counts once it drafted
    assert policy.draft_lens([missed] + fresh[1:], 32, 32)[0] == 0
    for _ in range(60):
        missed.idle(policy.prior.alpha)  # and drifts back to the workload's
    assert policy.draft_lens([missed] + fresh[1:], 32, 32)[0] == 4
    for _ in range(100):
        policy.record(4, 0)  # the workload turned unpredictable: new requests do not draft
    assert policy.draft_lens([SpecState()], 1, 1) == [0]
    assert policy.prior.wait == 0


def test_not_adaptive_drafts_k_max():
    policy = SpecPolicy(5, adaptive=False)
    assert policy.draft_lens([SpecState(alpha=0.0, num_drafted=1)] * 3, 64, 64) == [5, 5, 5]


def test_evidence_keeps_one_workloads_acceptance_out_of_another():
    """The 0.84x at 16 streams: a phase of well-predicted single streams must not make the
    short-match drafts of a new 16-stream phase draft, and that phase's misses must not stop
    the drafts of long matches (the text begins to loop) from drafting."""
    policy = _policy(lambda n: 0.008 + 0.0004 * n, (1, 2, 4, 8, 16, 32, 64, 128))
    fresh = [SpecState() for _ in range(16)]
    for _ in range(100):
        policy.record(4, 4, evidence_key(12, False))  # quoting: long matches all accepted
    assert policy.draft_lens(fresh, 16, 16, keys=[evidence_key(1, False)] * 16) == [0] * 16
    for _ in range(100):
        policy.record(4, 0, evidence_key(1, False))  # short matches miss
    assert policy.draft_lens(fresh, 16, 16, keys=[evidence_key(12, False)] * 16) == [4] * 16
    assert policy.table.alpha(evidence_key(1, False)) < 0.01


def test_evidence_buckets_and_their_unmeasured_acceptance():
    assert evidence_key(0, False) is None
    assert [evidence_key(m, False)[0] for m in (1, 2, 3, 4, 5, 6, 7, 9, 10, 14, 15, 40)] == \
        [1, 2, 3, 4, 5, 5, 7, 7, 10, 10, 15, 15]
    table = SpecPolicy(4).table
    means = [table.mean(evidence_key(m, False)) for m in (1, 2, 3, 4, 5, 7, 10, 15)]
    assert means == sorted(means) and means[0] == pytest.approx(0.4)
    four = table.mean(evidence_key(4, False))
    assert table.mean(evidence_key(4, True)) == pytest.approx(0.5 * four)  # sampled
    assert table.mean(evidence_key(4, False, 1)) == pytest.approx(0.8 * four)  # other outputs
    # the policy reads each one standard error low: the prior counts as 4 observations
    low = four - (four * (1 - four) / 4) ** 0.5
    assert table.alpha(evidence_key(4, False)) == pytest.approx(low)
    for _ in range(8):  # a new bucket learns fast: 8 missed drafts take 0.73 to a third
        table.record(evidence_key(4, False), 2, 0)
    assert table.mean(evidence_key(4, False)) == pytest.approx(four / 3)
    for _ in range(40):
        table.record(evidence_key(15, False), 1, 1)
    assert table.alpha(evidence_key(15, False)) > 0.9  # well measured: hardly discounted
    # with evidence the backoff of a request's own misses does not apply
    policy = _policy(lambda n: 0.010 * (1 + 0.025 * (n - 1)), (1, 2, 3, 4, 5))
    state = SpecState()
    state.record(4, 0)
    assert state.wait and policy.draft_lens([state], 1, 1)[0] == 0
    assert policy.draft_lens([state], 1, 1, keys=[evidence_key(10, False)])[0] == 4
    assert policy.draft_lens([state], 1, 1, keys=[evidence_key(10, False)], limits=[2]) == [2]


def test_may_draft_only_where_good_drafts_could_pay():
    # reading the weights dominates up to 32 tokens, then each token costs 1 ms
    policy = _policy(lambda n: 0.008 + 0.0001 * n + 0.0009 * max(0, n - 32),
                     (1, 2, 4, 8, 16, 32, 64, 128, 256, 320))
    assert policy.may_draft(1, 1, 1) and policy.may_draft(16, 16, 16)
    # 64 streams: a token more costs 1 ms against 64 tokens per 43.2 ms: none pays
    assert not policy.may_draft(64, 64, 64)
    assert SpecPolicy(4, adaptive=False).may_draft(64, 64, 64)
    # sampled drafts at temperature 1 are rarely accepted: once measured, not even proposed
    for match in (1, 2, 3, 4, 5, 7, 10, 15):
        for source in (0, 1):
            for _ in range(40):
                policy.record(2, 0, evidence_key(match, True, source))
    assert policy.table.best(True) < 0.1 < 0.7 < policy.table.best(False)
    assert not policy.may_draft(16, 16, 16, policy.table.best(True))
