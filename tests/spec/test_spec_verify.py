"""Verification of drafts on synthetic logits: the emitted tokens are distributed as the
target's (chi-square), acceptance follows p(d), and a seeded row emits what plain sampling
emits."""

from __future__ import annotations

import torch

from radixserve.core.sched_output import ScheduledSeq
from radixserve.runner.sampler import Sampler, SamplingBatch
from radixserve.runner.spec_verify import verify_drafts
from radixserve.sampling_params import SamplingParams

V = 16
CHI2_DF15_P999 = 37.70  # chi-square 0.999 quantile, 15 degrees of freedom


def _seq(i: int, draft: list[int], params: SamplingParams) -> ScheduledSeq:
    return ScheduledSeq(f"r{i}", [3, *draft], 10, [0], True, params, seed=1000 + i,
                        prompt_token_ids=[1, 2, 3], output_token_ids=[5],
                        num_draft=len(draft))


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def test_emitted_tokens_follow_the_target_distribution():
    torch.manual_seed(0)
    target = torch.randn(2, V) * 1.5  # row 0: after the fed token, row 1: after the draft
    d = int(target[0].softmax(-1).argsort()[-2])  # a likely but not the likeliest token
    n = 4000
    params = SamplingParams(temperature=1.0)
    seqs = [_seq(i, [d], params) for i in range(n)]
    out = verify_drafts(Sampler(), seqs, target.repeat(n, 1), None, torch.device("cpu"))
    p0, p1 = target[0].softmax(-1), target[1].softmax(-1)
    first = torch.bincount(torch.tensor(out.token_ids), minlength=V).double()
    assert _chi2(first, p0.double()) < CHI2_DF15_P999
    accepted = [out.drafts[s.request_id] for s in seqs if out.drafts[s.request_id].num_accepted]
    assert abs(len(accepted) / n - float(p0[d])) < 4 * (float(p0[d]) / n) ** 0.5 + 0.01
    second = torch.bincount(torch.tensor([a.token_ids[0] for a in accepted]),
                            minlength=V).double()
    assert _chi2(second, p1.double()) < CHI2_DF15_P999
    for s in seqs:  # a rejection emits exactly one token, never the drafted one
        r = out.drafts[s.request_id]
        assert r.num_drafted == 1 and len(r.token_ids) == r.num_accepted


def test_seeded_rows_emit_what_plain_sampling_emits():
    torch.manual_seed(1)
    logits = torch.randn(3, V)
    params = SamplingParams(temperature=0.9, top_k=8)
    seq = _seq(0, [4, 9], params)
    out = verify_drafts(Sampler(), [seq], logits, None, torch.device("cpu"))
    emitted = [out.token_ids[0], *out.drafts["r0"].token_ids]
    for i, tok in enumerate(emitted):  # each as a plain decode step after output + draft[:i]
        batch = SamplingBatch.build([params], [seq.seed], [[5, *seq.draft_token_ids[:i]]],
                                    [[1, 2, 3]], [frozenset()], V)
        assert Sampler()(logits[i:i + 1], batch).token_ids.item() == tok


def test_greedy_accepts_the_argmax_prefix():
    logits = torch.full((4, V), -5.0)
    for row, tok in enumerate([7, 2, 11, 3]):
        logits[row, tok] = 5.0
    params = SamplingParams(temperature=0.0, logprobs=1)
    out = verify_drafts(Sampler(), [_seq(0, [7, 2, 6], params)], logits, None,
                        torch.device("cpu"))
    r = out.drafts["r0"]
    assert [out.token_ids[0], *r.token_ids] == [7, 2, 11]  # 6 rejected: the argmax 11 instead
    assert r.num_accepted == 2 and len(r.logprobs) == 2
    assert out.logprobs[0] == max(torch.log_softmax(logits[0], -1)).item()
