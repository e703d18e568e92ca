"""Sampler: processing order, truncation, penalties, logprobs and batch-invariant seeding."""

from __future__ import annotations

import pytest
import torch

from radixserve.runner.sampler import (
    Sampler,
    SamplingBatch,
    _candidates,
    _process_logits,
    _truncation_threshold,
    _uniform,
    greedy,
)
from radixserve.sampling_params import SamplingParams as SP

sampler = Sampler()


@pytest.fixture(autouse=True)
def _one_thread():
    """Tensors here are tiny: OpenMP barriers on a busy CI box would dominate the runtime."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def build(params, *, seeds=None, outputs=None, prompts=None, stops=None, V):
    n = len(params)
    return SamplingBatch.build(
        params,
        seeds if seeds is not None else list(range(n)),
        outputs if outputs is not None else [[] for _ in range(n)],
        prompts if prompts is not None else [[0] for _ in range(n)],
        stops if stops is not None else [set() for _ in range(n)],
        V,
        torch.device("cpu"),
    )


def sample(params, logits, **kw):
    return sampler(logits, build(params, V=logits.shape[1], **kw)).token_ids


def sample_many(p: SP, row: torch.Tensor, n: int, *, step: int = 0) -> torch.Tensor:
    """``n`` samples of one logits row, one seed each (the batch dimension is the seed)."""
    logits = row.unsqueeze(0).expand(n, -1).contiguous()
    return sample([p] * n, logits, outputs=[[1] * step] * n)


def freqs(tokens: torch.Tensor, V: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=V).double() / len(tokens)


# ---- greedy and its limits ----------------------------------------------------------------------


def test_greedy_equals_argmax():
    logits = torch.randn(6, 100, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sample([SP(temperature=0)] * 6, logits), logits.argmax(-1))


@pytest.mark.parametrize("V", [49_152, 151_936, 1000, 50, 1024])
def test_two_pass_greedy_is_argmax_ties_and_nan_included(V):
    g = torch.Generator().manual_seed(V)
    x = torch.randn(9, V, generator=g)
    x[1, [3, V - 1]] = 50.0  # a tie: the first index wins
    x[2, :] = 1.0  # all equal
    x[3, [V // 2, V - 2]] = float("nan")  # the first NaN wins, as in argmax
    x[4, V - 1] = float("inf")
    x[5, :] = float("-inf")
    x[6, [0, V // 3]] = float("inf")
    assert torch.equal(greedy(x), x.argmax(dim=-1))
    assert torch.equal(greedy(x[:, ::1].t().contiguous().t()), x.argmax(dim=-1))  # strided


def test_greedy_rows_in_a_mixed_batch_take_argmax():
    logits = torch.randn(6, 100, generator=torch.Generator().manual_seed(1))
    params = [SP(temperature=0), SP(temperature=1.0, top_p=0.5)] * 3
    out = sample(params, logits)
    assert torch.equal(out[0::2], logits[0::2].argmax(-1))


def test_temperature_to_zero_limit():
    row = torch.tensor([1.0, 3.0, 2.0, 2.5, -1.0])
    assert (sample_many(SP(temperature=0.01), row, 500) == 1).all()
    assert (sample_many(SP(temperature=1e-7), row, 10) == 1).all()  # below eps: greedy


def test_top_k_1_and_tiny_top_p_equal_greedy():
    row = torch.randn(1000, generator=torch.Generator().manual_seed(2))
    assert (sample_many(SP(temperature=1.5, top_k=1), row, 500) == row.argmax()).all()
    assert (sample_many(SP(temperature=1.5, top_p=1e-6), row, 500) == row.argmax()).all()


# ---- truncation ---------------------------------------------------------------------------------


def _reference_keep(probs: torch.Tensor, k: int, p: float, min_p: float) -> torch.Tensor:
    """Full-sort top-k → top-p → min-p mask for one row. Top-p over the top-k-renormalised
    distribution is written as "mass before < p · mass(top-k)": dividing by the mass instead
    would round differently at the boundary."""
    vals, idx = probs.sort(descending=True)
    k = k if 0 < k < len(vals) else len(vals)
    keep = torch.arange(len(vals)) < k
    cs = vals.cumsum(0)
    before = torch.cat([torch.zeros(1), cs[:-1]])
    if p < 1:
        keep &= before < p * (cs[k - 1] if k < len(vals) else 1.0)
    keep &= vals >= min_p * vals[0]
    out = torch.zeros_like(keep)
    out[idx] = keep
    return out


@pytest.mark.parametrize("V, scale", [(50, 3.0), (2000, 0.2), (49152, 3.0), (49152, 0.5)])
def test_truncation_threshold_matches_sort_reference(V, scale):
    # flat rows (small scale, large V) exercise the wider top-p passes: 4104 best, then all
    gen = torch.Generator().manual_seed(3)
    cases = [(-1, 0.9, 0.0), (10, 1.0, 0.0), (20, 0.7, 0.0), (-1, 1.0, 0.3), (30, 0.8, 0.05),
             (-1, 0.95, 0.0), (5, 0.99, 0.5), (0, 0.5, 0.0)]
    params = [SP(top_k=k, top_p=p, min_p=m) for k, p, m in cases]
    probs = torch.softmax(torch.randn(len(cases), V, generator=gen) * scale, -1)
    batch = build(params, V=V)
    thr = _truncation_threshold(probs, _candidates(probs, batch.topk_width), batch)
    for i, (k, p, m) in enumerate(cases):
        assert torch.equal(probs[i] >= thr[i], _reference_keep(probs[i], k, p, m)), cases[i]


def test_sampled_distribution_matches_softmax():
    row = torch.tensor([1.0, 0.5, 2.0, -0.5, 0.0, 1.5, -1.0, 0.8])
    got = freqs(sample_many(SP(temperature=0.7), row, 4000), 8)
    want = torch.softmax(row.double() / 0.7, -1)
    assert (got - want).abs().max() < 0.03


@pytest.mark.parametrize("p, keep", [
    (SP(top_k=3), [2, 5, 0]), (SP(top_p=0.6), [2, 5, 0]), (SP(top_p=0.5), [2, 5]),
    (SP(min_p=0.3), [2, 5, 0, 7]), (SP(top_k=3, top_p=0.7), [2, 5]),
])
def test_truncated_distribution_is_renormalised(p, keep):
    # probs ≈ [.133, .081, .361, .030, .049, .219, .018, .109]; top-3 renormalised: .51, .31, .19
    row = torch.tensor([1.0, 0.5, 2.0, -0.5, 0.0, 1.5, -1.0, 0.8])
    got = freqs(sample_many(p, row, 4000), 8)
    want = torch.zeros(8, dtype=torch.float64)
    want[keep] = torch.softmax(row.double()[keep], -1)
    assert (got - want).abs().max() < 0.03


# ---- logit bias, min_tokens, penalties ----------------------------------------------------------


def test_logit_bias_forces_and_bans():
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(4))
    top = logits.argmax(-1)
    forced = sample([SP(logit_bias={7: 100.0}, seed=0)] * 2, logits)
    assert (forced == 7).all()
    banned = sample([SP(temperature=0, logit_bias={int(t): -100.0}) for t in top], logits)
    assert torch.equal(banned, logits.topk(2, -1).indices[:, 1])


def test_min_tokens_bans_stop_ids_until_reached():
    logits = torch.tensor([[0.0, 5.0, 1.0, 4.0, 2.0]] * 3)
    params = [SP(temperature=0, min_tokens=3, stop_token_ids=[3])] * 3
    stops = [{1, 3}] * 3
    outs = [[9, 9], [9, 9, 9], [9]]
    assert sample(params, logits, outputs=outs, stops=stops).tolist() == [4, 1, 4]


def test_penalties_hand_computed():
    V = 5
    logits = torch.tensor([[2.0, -1.0, 0.5, 1.0, -2.0]] * 2)
    params = [SP(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25), SP()]
    batch = build(params, outputs=[[1, 1, 3]] * 2, prompts=[[0]] * 2, V=V)
    x = _process_logits(logits, batch)
    # repetition over {0, 1, 3}: 2 → 1, -1 → -2, 1 → 0.5; then token 1 (count 2):
    # -2 - .5 - .5; token 3 (count 1): 0.5 - .5 - .25
    assert torch.allclose(x[0], torch.tensor([1.0, -3.0, 0.5, -0.25, -2.0]))
    assert torch.equal(x[1], logits[1])  # a row without penalties is untouched
    assert torch.equal(logits[0], torch.tensor([2.0, -1.0, 0.5, 1.0, -2.0]))  # input untouched


def test_presence_and_frequency_ignore_prompt_tokens():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    batch = build([SP(presence_penalty=1.0, frequency_penalty=1.0)], outputs=[[2]],
                  prompts=[[0, 0, 1]], V=3)
    assert _process_logits(logits, batch).tolist() == [[2.0, 1.0, -2.0]]


# ---- seeding ------------------------------------------------------------------------------------


def _row_alone(p, row, seed, step):
    return sample([p], row.unsqueeze(0), seeds=[seed], outputs=[[5] * step]).item()


@pytest.mark.parametrize("V, scale, p", [
    (1000, 2.0, SP(temperature=0.8)),
    (1000, 2.0, SP(temperature=0.8, top_p=0.9, top_k=50)),
    (3000, 0.1, SP(top_p=0.95, min_p=0.001)),  # nucleus wider than the top-p candidates
    (3000, 1.0, SP(top_p=0.55)),  # ~580 tokens: full path alone, candidates next to top_k=700
])
def test_seeded_sample_is_batch_invariant(V, scale, p):
    gen = torch.Generator().manual_seed(5)
    neighbours = [SP(temperature=0), SP(temperature=1.3, top_k=5), SP(top_p=0.5),
                  SP(min_p=0.2, presence_penalty=1.0), SP(repetition_penalty=1.3, top_k=700),
                  SP(logprobs=5, logit_bias={1: 3.0}), SP(temperature=0.5, top_p=0.99)]
    for seed, step in [(0, 0), (1234567, 3), (-5, 17), (2**70 + 9, 2)]:
        row = torch.randn(V, generator=gen) * scale
        want = _row_alone(p, row, seed, step)
        for i in range(8):  # every index, each time with fresh neighbours in a fresh order
            others = torch.randn(7, V, generator=gen) * (scale * (1 + i % 3))
            logits = torch.cat([others[:i], row.unsqueeze(0), others[i:]])
            params = [neighbours[j] for j in torch.randperm(7, generator=gen).tolist()]
            params.insert(i, p)
            seeds, outs = list(range(100 + i, 107 + i)), [[5] * j for j in range(7)]
            seeds.insert(i, seed)
            outs.insert(i, [5] * step)
            got = sample(params, logits, seeds=seeds, outputs=outs)[i].item()
            assert got == want, (seed, step, i)


def test_batch_invariant_at_real_vocab_with_threads():
    """V = 49152 is above torch's parallel grain: a single row's sum would be split across
    threads (and round differently) when B = 1. The sampler must not depend on that."""
    torch.set_num_threads(max(2, torch.get_num_threads()))
    V, gen = 49152, torch.Generator().manual_seed(7)
    params = [SP(temperature=0.9), SP(top_p=0.9), SP(top_p=0.6), SP(top_k=40, min_p=0.01),
              SP(min_p=0.02), SP(top_k=6000, temperature=0.7)]  # top_k=6000 widens candidates
    logits = torch.randn(len(params), V, generator=gen) * 2.5
    seeds = list(range(11, 11 + len(params)))
    batched = sample(params, logits, seeds=seeds, outputs=[[1] * 4] * len(params))
    alone = [sample([p], logits[i:i + 1], seeds=[seeds[i]], outputs=[[1] * 4]).item()
             for i, p in enumerate(params)]
    assert batched.tolist() == alone
    # the property the sampler relies on: softmax and cumsum reduce each row on its own
    probs = torch.softmax(logits, -1)
    assert torch.equal(torch.softmax(logits[1:2], -1)[0], probs[1])
    assert torch.equal(probs[1:2].double().cumsum_(-1)[0], probs.double().cumsum_(-1)[1])


def test_different_seeds_and_steps_give_different_samples():
    row = torch.zeros(64)
    by_seed = sample_many(SP(), row, 1000)
    assert len(set(by_seed.tolist())) > 50
    assert (freqs(by_seed, 64) - 1 / 64).abs().max() < 0.03
    by_step = [_row_alone(SP(), row, 42, step) for step in range(100)]
    assert len(set(by_step)) > 40


def test_uniform_is_uniform_and_in_range():
    seeds = torch.arange(20000, dtype=torch.int64) * 7919 - 10**6
    u = _uniform(seeds, torch.arange(20000, dtype=torch.int64) % 7)
    assert u.min() >= 0 and u.max() < 1
    hist = torch.histc(u.float(), bins=20, min=0, max=1) / len(u)
    assert (hist - 0.05).abs().max() < 0.01
    assert torch.equal(u, _uniform(seeds, torch.arange(20000, dtype=torch.int64) % 7))


# ---- logprobs and build -------------------------------------------------------------------------


def test_logprobs_are_raw_log_softmax():
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(6))
    params = [SP(logprobs=3, temperature=0.5, logit_bias={0: 50.0}), SP(logprobs=0),
              SP(temperature=0, repetition_penalty=1.5), SP(logprobs=2, top_p=0.3)]
    out = sampler(logits, build(params, outputs=[[1, 2]] * 4, V=30))
    raw = torch.log_softmax(logits, -1)
    assert torch.allclose(out.logprobs, raw.gather(1, out.token_ids.unsqueeze(1)).squeeze(1))
    ids, lps = out.top_logprobs
    assert ids.shape == lps.shape == (4, 3)
    assert torch.allclose(lps, raw.gather(1, ids))
    assert torch.equal(lps, lps.sort(-1, descending=True).values)
    assert torch.equal(ids[:, 0], logits.argmax(-1))
    assert out.token_ids[0] == 0  # the bias acted on sampling, not on the logprobs


def test_logprobs_absent_when_not_asked():
    out = sampler(torch.randn(2, 10), build([SP(), SP(temperature=0)], V=10))
    assert out.logprobs is None and out.top_logprobs is None
    out = sampler(torch.randn(2, 10), build([SP(logprobs=0), SP()], V=10))
    assert out.logprobs.shape == (2,)
    assert [t.shape for t in out.top_logprobs] == [(2, 0), (2, 0)]  # set whenever logprobs is


def test_build_sets_unused_fields_to_none():
    b = build([SP(), SP(temperature=0, top_p=0.5, top_k=3, min_p=0.1)], V=100)
    assert (b.top_k, b.top_p, b.min_p, b.presence_penalty, b.frequency_penalty,
            b.repetition_penalty, b.logit_bias, b.output_counts, b.seen_tokens,
            b.min_tokens_block, b.max_num_logprobs) == (None,) * 11
    assert not b.all_greedy and b.topk_width == 0
    assert b.temperature.tolist() == [1.0, 0.0]
    b = build([SP(temperature=0)] * 2, V=100)
    assert b.all_greedy
    params = [SP(top_k=5000, top_p=0.9, logprobs=2, min_tokens=2),
              SP(top_k=7, logprobs=4, presence_penalty=0.1)]
    b = build(params, outputs=[[3], [4, 4]], stops=[{0}, {0}], V=1000)
    assert b.top_k.tolist() == [1000, 7] and b.topk_width == 512  # k > V: disabled, top-p only
    assert b.max_num_logprobs == 4 and not b.all_greedy
    assert [t.tolist() for t in b.min_tokens_block] == [[0], [0]]
    assert [t.tolist() for t in b.output_counts] == [[1], [4], [2.0]]
    assert b.steps.tolist() == [1, 2]


def test_empty_batch():
    out = sampler(torch.empty(0, 10), build([], V=10))
    assert out.token_ids.shape == (0,) and out.logprobs is None
